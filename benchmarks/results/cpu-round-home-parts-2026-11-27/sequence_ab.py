import json, os, statistics, subprocess, sys, time
SIZES = [(30, 4, 256, 256), (100, 1, 256, 256), (8, 1, 256, 256), (50, 2, 64, 512), (16, 64, 16, 256), (8, 32, 8, 64)]
def worker():
    import torch, pyroundlib
    out = {}
    def t(f, n):
        for _ in range(3): f()
        ts = []
        for _ in range(5):
            s = time.perf_counter()
            for _ in range(n): f()
            ts.append((time.perf_counter() - s) / n * 1e6)
        return statistics.median(ts)
    for T, B, I, S in SIZES:
        torch.manual_seed(0)
        args = [torch.randn(T, B, I), torch.randn(3 * S, S + I) / S ** 0.5, torch.randn(3 * S), torch.randn(B, S), torch.randn(B, S)]
        for a in args: a.requires_grad_()
        def train():
            o, (h, c) = pyroundlib.lltm_sequence(args[0], args[1], args[2], (args[3], args[4]))
            return torch.autograd.grad(o.sum() + h.sum() + c.sum(), args)
        def infer():
            with torch.inference_mode():
                return pyroundlib.lltm_sequence(args[0], args[1], args[2], (args[3], args[4]))
        n = max(2, int(20000 / (T * B * S * S / 1e4 + 50)))
        out[f"({T},{B},{I},{S}) fwd+bwd"] = t(train, n)
        out[f"({T},{B},{I},{S}) inference"] = t(infer, n)
    x = torch.randn(1 << 20) * 4
    out["round 2^20 f32"] = t(lambda: pyroundlib.round_ste(x), 200)
    print("JSON" + json.dumps(out))
def main(old, new, rounds):
    times = {"old": [], "new": []}
    for r in range(rounds):
        for which in (["old", "new"] if r % 2 == 0 else ["new", "old"]):
            env = dict(os.environ, PYROUNDLIB_LIBRARY=old if which == "old" else new)
            p = subprocess.run([sys.executable, __file__, "worker"], env=env, capture_output=True, text=True)
            line = [l for l in p.stdout.splitlines() if l.startswith("JSON")]
            if not line: print(which, "failed", p.stderr[-2000:]); continue
            times[which].append(json.loads(line[0][4:]))
    o, n = times["old"], times["new"]
    for k in o[0]:
        ratios = [b[k] / a[k] for a, b in zip(o, n)]
        print(f"{k}: old {statistics.median(a[k] for a in o):.1f} us, new {statistics.median(b[k] for b in n):.1f} us, new/old {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})", flush=True)
if __name__ == "__main__":
    worker() if sys.argv[1] == "worker" else main(sys.argv[2], sys.argv[3], int(sys.argv[4]))
