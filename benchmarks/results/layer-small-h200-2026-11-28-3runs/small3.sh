# on the GPU machine, from the repository root, the library built there (PYROUNDLIB_LIBRARY) and OUT set
export PYTHONPATH=$PWD
for r in 1 2 3; do
  timeout 150 python3 benchmarks/bench.py --rounds 15 --only "(T,B,I,S)=(8,32,8,64), padded, float32" --out $OUT/small$r > $OUT/small$r.txt 2>&1
  echo "run $r rc=$?"; grep -E "^LLTMLayer" $OUT/small$r.txt
done
