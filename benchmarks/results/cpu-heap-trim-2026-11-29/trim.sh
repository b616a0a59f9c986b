# glibc heap trimming: a loop of one model alone, with and without MALLOC_TRIM_THRESHOLD_
E="MALLOC_TRIM_THRESHOLD_=1000000000 MALLOC_MMAP_THRESHOLD_=1000000000"
export CUDA_VISIBLE_DEVICES= PYROUNDLIB_LIBRARY=${PYROUNDLIB_LIBRARY:-$PWD/pyroundlib/libpyroundlib.so} PYTHONPATH=$PWD
nproc; python3 -c "import torch; print(torch.__version__, torch.get_num_threads())"
for sz in 50,64,64,128 30,16,256,256 16,64,16,256; do
 for rep in 1 2; do
  for e in "" "$E"; do
   for who in ours lstm; do
    r=$( { /usr/bin/time -f "sys %S" env $e python3 benchmarks/results/cpu-heap-trim-2026-11-29/train.py $sz $who 300; } 2>&1 | tr '\n' ' ')
    echo "[${e:+notrim}] $r"
   done
  done
 done
done
