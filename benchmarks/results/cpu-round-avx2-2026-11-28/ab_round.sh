#!/bin/bash
# cpu.py's round rows with two library builds, alternating processes: ab_round.sh OUT ROUNDS
out=$1; rounds=${2:-3}
for i in $(seq 1 $rounds); do
  for lib in old new; do
    PYROUNDLIB_LIBRARY=$PWD/build-$lib/libpyroundlib.so PYTHONPATH=$PWD CUDA_VISIBLE_DEVICES= \
      python3 benchmarks/cpu.py --only "round forward" --rounds 5 --out $out/$lib-$i > $out/$lib-$i.log 2>&1
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, sys, glob, statistics, os
out, rounds = sys.argv[1], int(sys.argv[2])
def ratios(lib, i):
    path = glob.glob(f"{out}/{lib}-{i}/**/results.json", recursive=True)[0]
    data = json.load(open(path))
    rows = data["results"]
    got = {}
    for r in rows:
        case = r["case"]
        if case.startswith("round forward"):
            got[case] = (r["ratios"].get("torch.round"), None)
    return got
cases = ratios("old", 1).keys()
print(f"{'case':34s} {'old / torch.round':>28s} {'new / torch.round':>28s}")
for c in cases:
    old = [ratios("old", i)[c][0] for i in range(1, rounds + 1)]
    new = [ratios("new", i)[c][0] for i in range(1, rounds + 1)]
    print(f"{c:34s} {statistics.median(old):8.3f} ({min(old):.3f}-{max(old):.3f})   {statistics.median(new):8.3f} ({min(new):.3f}-{max(new):.3f})")
PY
