# alternating processes: old library, new library; 4 pairs; prints per-case medians and new/old
set -e
for i in 1 2 3 4; do
  PYROUNDLIB_LIBRARY=$PWD/build-ab/libpyroundlib-old.so python3 tmp-diag/ab_cpu.py > $OUT/old$i.json
  PYROUNDLIB_LIBRARY=$PWD/build-gpu/libpyroundlib.so python3 tmp-diag/ab_cpu.py > $OUT/new$i.json
done
python3 - <<'PY'
import json, os, statistics
out = os.environ["OUT"]
old = [json.load(open(f"{out}/old{i}.json")) for i in range(1, 5)]
new = [json.load(open(f"{out}/new{i}.json")) for i in range(1, 5)]
for k in old[0]:
    o = statistics.median(d[k] for d in old); n = statistics.median(d[k] for d in new)
    pairs = [b[k] / a[k] for a, b in zip(old, new)]
    print(f"{k}: old {o:9.1f} us  new {n:9.1f} us  new/old {n/o:.3f}  (pairs {min(pairs):.2f}-{max(pairs):.2f})")
PY
