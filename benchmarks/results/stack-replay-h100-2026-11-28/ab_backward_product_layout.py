"""A/B in alternating fresh processes of pyroundlib trees (same library): fwd+bwd rows the backward's step product serves.
python ab3.py main ROUNDS NAME=TREE...  |  python ab3.py worker"""
import json, os, statistics, subprocess, sys
from pathlib import Path as _Path

sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))
import ab  # noqa: E402  benchmarks/ab.py

ROWS = [((100, 256, 512, 1024), "float32"), ((200, 64, 128, 768), "float32"),
        ((100, 256, 512, 1024), "bfloat16"), ((50, 64, 256, 512), "bfloat16")]

def worker():
    import torch, pyroundlib
    torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False
    out = {}
    def timeit(f, calls=2, reps=3):
        for _ in range(6): f()
        ts = []
        for _ in range(reps):
            torch.cuda.synchronize(); a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(calls): f()
            b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) / calls)
        return statistics.median(ts)
    for (T, B, I, S), dt in ROWS:
        kw = dict(device="cuda", dtype=getattr(torch, dt))
        torch.manual_seed(0)
        layer = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, **kw)
        x = torch.randn(T, B, I, **kw, requires_grad=True)
        params = [x, *layer.parameters()]
        def train():
            o, (h, c) = layer(x)
            return torch.autograd.grad(o.float().sum() + h.float().sum() + c.float().sum(), params)
        out[f"layer {T},{B},{I},{S} {dt} padded fwd+bwd"] = timeit(train)
        w = torch.randn(3 * S, S + I, **kw) * 0.05
        bias = torch.zeros(3 * S, **kw, requires_grad=True); w.requires_grad_()
        def seq():
            o, (h, c) = pyroundlib.lltm_sequence(x, w, bias)
            return torch.autograd.grad(o.float().sum(), [x, w, bias])
        out[f"lltm_sequence {T},{B},{I},{S} {dt} fwd+bwd"] = timeit(seq)
    print("JSON" + json.dumps(out))

def main(rounds, names_trees):
    ab.main(__file__, rounds, names_trees)  # benchmarks/ab.py

if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker()
    else:
        main(int(sys.argv[2]), sys.argv[3:])
