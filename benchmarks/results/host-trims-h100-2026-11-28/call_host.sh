#!/bin/bash
cd "$(dirname "$0")/.."
export PYROUNDLIB_LIBRARY=$PWD/build-gpu/libpyroundlib.so
nvidia-smi -L
for i in 1 2 3 4; do
  for tree in old new; do
    echo "== $tree $i"; PYTHONPATH=$PWD/tmp-diag/tree-$tree timeout -k 5 60 python3 tmp-diag/ab_host.py 2>&1 | grep -v Warn
  done
done > $OUT/ab_host.txt
cat $OUT/ab_host.txt | tail -5
export PYTHONPATH=$PWD:$PWD/tmp-diag
mkdir -p $OUT/shards
for k in 0 1 2 3 4 5 6 7; do
  SHARD=$k/8 timeout -k 5 ${SHARD_LIMIT:-300} python3 -m pytest -q -p no:cacheprovider -p shard_plugin -rfE tests/test_layer.py tests/test_sequence.py > $OUT/shards/s$k.txt 2>&1 &
done
wait
for k in 0 1 2 3 4 5 6 7; do tail -1 $OUT/shards/s$k.txt; done
grep -hE "^(FAILED|ERROR)" $OUT/shards/*.txt | head -20
cat $OUT/shards/*.txt > $OUT/tests.txt; rm -rf $OUT/shards
