"""Measuring build: AB_WIDE6=2 (6 x 64 register tiles) against 1 (6 x 32), alternating fresh
processes; each process times lltm_sequence (inference and fwd+bwd) and nn.LSTM."""
import json, os, statistics, subprocess, sys, time
SIZES = [(50, 64, 64, 128), (30, 4, 256, 256), (100, 64, 256, 256), (16, 64, 16, 256), (100, 32, 64, 128),
         (30, 16, 256, 256), (100, 12, 64, 256), (8, 32, 8, 64), (64, 8, 128, 64)]
CHILD = r'''
import json, sys, time, torch, pyroundlib
def timed(f, reps):
    f(); t = time.perf_counter()
    for _ in range(reps): f()
    return (time.perf_counter() - t) / reps
out = {}
for (T, B, I, S) in %r:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, B, I, generator=g).requires_grad_()
    w = (torch.randn(3 * S, S + I, generator=g) * S ** -0.5).requires_grad_()
    b = (torch.randn(3 * S, generator=g) * 0.1).requires_grad_()
    h0, c0, gr = torch.randn(B, S, generator=g), torch.randn(B, S, generator=g), torch.randn(T, B, S, generator=g)
    def inf():
        with torch.inference_mode(): return pyroundlib.lltm_sequence(x, w, b, (h0, c0))
    def trn():
        o, _ = pyroundlib.lltm_sequence(x, w, b, (h0, c0)); return torch.autograd.grad(o, [x, w, b], gr)
    reps = max(1, int(0.03 / timed(trn, 1)))
    out[str((T, B, I, S))] = [min(timed(inf, reps * 3) for _ in range(5)), min(timed(trn, reps) for _ in range(5))]
print(json.dumps(out))
''' % (SIZES,)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
res = {"1": [], "2": []}
for r in range(rounds):
    for v in (["1", "2"] if r % 2 == 0 else ["2", "1"]):
        p = subprocess.run([sys.executable, "-c", CHILD], env={**os.environ, "AB_WIDE6": v}, capture_output=True, text=True, check=True)
        res[v].append(json.loads(p.stdout.strip().splitlines()[-1]))
for size in res["1"][0]:
    for i, name in enumerate(["inference", "fwd+bwd"]):
        ratios = [b[size][i] / a[size][i] for a, b in zip(res["1"], res["2"])]
        print(f"{size} {name}: 6x64 / 6x32 median {statistics.median(ratios):.3f} (rounds {' '.join(f'{x:.3f}' for x in ratios)})", flush=True)
