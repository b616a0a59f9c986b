import math, statistics, sys, time, json, torch, pyroundlib
torch.manual_seed(0)
def med(fn, reps):
    for _ in range(3): fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6
out = {}
for (T, B, I, S) in [(16, 64, 16, 256), (1, 64, 16, 256), (100, 64, 256, 256), (50, 64, 64, 128), (100, 32, 64, 128),
                     (8, 32, 8, 64), (64, 8, 128, 64), (20, 16, 32, 32)]:
    x = torch.randn(T, B, I, requires_grad=True); w = (torch.randn(3 * S, S + I) / math.sqrt(S)).requires_grad_()
    b = (torch.randn(3 * S) * 0.1).requires_grad_(); h0, c0 = torch.randn(B, S), torch.randn(B, S)
    g = torch.randn(T, B, S)
    def inf():
        with torch.inference_mode():
            return pyroundlib.lltm_sequence(x, w, b, (h0, c0))
    def train():
        return torch.autograd.grad(pyroundlib.lltm_sequence(x, w, b, (h0, c0))[0], [x, w, b], g)
    reps = max(5, min(200, int(2e8 / (T * B * S * S * 3 + 1))))
    out[f"({T},{B},{I},{S}) inference"] = med(inf, reps)
    out[f"({T},{B},{I},{S}) fwd+bwd"] = med(train, max(5, reps // 3))
print(json.dumps(out))
