"""A/B of pyroundlib trees (same library) in alternating fresh processes, the first the
baseline: float32 step loops' backward product from a contiguous W_h against a view of the
weights; TF32 off. nn.LSTM of the same configuration timed in every worker (the peer).
python ab_wh.py main ROUNDS NAME=TREE ...   |   python ab_wh.py worker"""
import json, os, statistics, subprocess, sys

CASES = [("layer", 100, 256, 512, 1024, False), ("layer", 100, 256, 512, 1024, True),
         ("layer", 100, 128, 256, 1024, False), ("sequence", 100, 256, 512, 1024, False),
         ("sequence", 100, 256, 2048, 1024, False), ("layer", 200, 64, 128, 768, False)]

def worker():
    import torch, pyroundlib
    from torch.nn.utils.rnn import pack_padded_sequence
    torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False
    def timeit(f, calls=2, reps=5):
        for _ in range(5): f()
        ts = []
        for _ in range(reps):
            torch.cuda.synchronize(); a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(calls): f()
            b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) / calls)
        return statistics.median(ts)
    out = {}
    kw = dict(device="cuda", dtype=torch.float32)
    for kind, T, B, I, S, packed in CASES:
        torch.manual_seed(0)
        x = torch.randn(T, B, I, **kw, requires_grad=True)
        name = f"{kind} {T},{B},{I},{S}" + (" packed" if packed else "")
        if kind == "sequence":
            w = (torch.randn(3 * S, S + I, **kw) / S ** 0.5).requires_grad_()
            b = torch.zeros(3 * S, **kw, requires_grad=True)
            h0, c0 = torch.zeros(B, S, **kw), torch.zeros(B, S, **kw)
            def ours():
                o, (h, c) = pyroundlib.lltm_sequence(x, w, b, (h0, c0))
                torch.autograd.grad(o.sum(), (x, w, b))
            out[name] = timeit(ours)
            continue
        lengths = torch.randint(T // 2, T + 1, (B,), generator=torch.Generator().manual_seed(1))
        for who, m in (("ours", pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, **kw)),
                       ("nn.LSTM", torch.nn.LSTM(I, S, num_layers=2, bidirectional=True, **kw))):
            def train():
                inp = pack_padded_sequence(x, lengths, enforce_sorted=False) if packed else x
                o, (h, c) = m(inp)
                o = o.data if packed else o
                torch.autograd.grad(o.sum() + h.sum() + c.sum(), [x, *m.parameters()])
            out[f"{name} fwd+bwd {who}"] = timeit(train)
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
        line = f"{k}: {names[0]} {statistics.median(a[k] for a in o):.3f} ms"
        for name in names[1:]:
            n = times[name]
            ratios = [b[k] / a[k] for a, b in zip(o, n)]
            line += (f" | {name} {statistics.median(b[k] for b in n):.3f} ms, /{names[0]} {statistics.median(ratios):.3f}"
                     f" ({min(ratios):.3f}-{max(ratios):.3f})")
        print(line, flush=True)
    for name in names:  # ours / nn.LSTM per worker, median
        for k in o[0]:
            if k.endswith(" ours"):
                r = [a[k] / a[k[:-5] + " nn.LSTM"] for a in times[name]]
                print(f"{name}: {k[:-5]} / nn.LSTM {statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f})", flush=True)

if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker()
    else:
        main(int(sys.argv[2]), sys.argv[3:])
