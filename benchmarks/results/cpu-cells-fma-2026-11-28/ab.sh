#!/bin/bash
# Xeon (CPU only): the two CPU builds in alternating processes, 3 each; run from the repository root
export CUDA_VISIBLE_DEVICES= PYTHONPATH=$PWD
lscpu | grep -E "Model name|^CPU\(s\)" > $OUT/cpu.txt
python3 -c "import torch;print(torch.__version__, torch.get_num_threads())" >> $OUT/cpu.txt
for i in 1 2 3; do
  for b in abold abnew; do
    echo "== $b $i" >> $OUT/ab.txt
    PYROUNDLIB_LIBRARY=$PWD/build-$b/libpyroundlib.so ROUNDS=7 timeout 150 python3 benchmarks/results/cpu-cells-fma-2026-11-28/ab_seq.py >> $OUT/ab.txt 2>&1
  done
done
echo done
