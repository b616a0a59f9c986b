"""A/B in alternating fresh processes of pyroundlib trees (same library): fwd+bwd rows the backward's step product serves.
python ab3.py main ROUNDS NAME=TREE...  |  python ab3.py worker"""
import json, os, statistics, subprocess, sys

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
