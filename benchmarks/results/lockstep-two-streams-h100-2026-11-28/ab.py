"""A/B of several pyroundlib trees (same library) in alternating fresh processes, the first the
baseline: a 2-layer bidirectional float32 layer, padded, TF32 off. The worker is the one of
../lockstep-float32-replay-h100-2026-11-27/ab.py at other sizes.
python ab.py main ROUNDS NAME=TREE ...   |   python ab.py worker"""
import importlib.util, json, os, statistics, subprocess, sys
from pathlib import Path as _Path

sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))
import ab  # noqa: E402  benchmarks/ab.py
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "earlier_ab", Path(__file__).resolve().parent.parent / "lockstep-float32-replay-h100-2026-11-27" / "ab.py")
earlier = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(earlier)
earlier.LAYER = [(200, 64, 128, 768), (100, 64, 256, 1024), (100, 256, 512, 1024)]
worker = earlier.worker

def main(rounds, names_trees):
    ab.main(__file__, rounds, names_trees)  # benchmarks/ab.py

if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker()
    else:
        main(int(sys.argv[2]), sys.argv[3:])
