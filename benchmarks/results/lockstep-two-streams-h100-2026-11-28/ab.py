"""A/B of several pyroundlib trees (same library) in alternating fresh processes, the first the
baseline: a 2-layer bidirectional float32 layer, padded, TF32 off. The worker is the one of
../lockstep-float32-replay-h100-2026-11-27/ab.py at other sizes.
python ab.py main ROUNDS NAME=TREE ...   |   python ab.py worker"""
import importlib.util, json, os, statistics, subprocess, sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "earlier_ab", Path(__file__).resolve().parent.parent / "lockstep-float32-replay-h100-2026-11-27" / "ab.py")
earlier = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(earlier)
earlier.LAYER = [(200, 64, 128, 768), (100, 64, 256, 1024), (100, 256, 512, 1024)]
worker = earlier.worker

def main(rounds, names_trees):
    trees = dict(nt.split("=", 1) for nt in names_trees)
    names = list(trees)
    times = {n: [] for n in names}
    for r in range(rounds):
        for which in (names if r % 2 == 0 else names[::-1]):
            env = dict(os.environ, PYTHONPATH=trees[which])
            p = subprocess.run([sys.executable, __file__, "worker"], env=env, capture_output=True, text=True)
            line = [l for l in p.stdout.splitlines() if l.startswith("JSON")]
            if not line:
                print(which, "failed", p.stdout[-2000:], p.stderr[-3000:], flush=True); continue
            times[which].append(json.loads(line[0][4:]))
        print("round", r, "done", flush=True)
    o = times[names[0]]
    for k in o[0]:
        line = f"{k}: {names[0]} {statistics.median(a[k] for a in o):.3f}"
        for name in names[1:]:
            n = times[name]
            ratios = [b[k] / a[k] for a, b in zip(o, n)]
            line += (f" | {name} {statistics.median(b[k] for b in n):.3f}, /{names[0]} {statistics.median(ratios):.3f}"
                     f" ({min(ratios):.3f}-{max(ratios):.3f})")
        print(line, flush=True)

if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker()
    else:
        main(int(sys.argv[2]), sys.argv[3:])
