"""Where (30,16,256,256)-like CPU calls go: lltm_sequence inference / fwd+bwd under forced splits
(measuring build: PRL_AB_ROWS=n row parts, PRL_AB_STEPS=n column parts a step), the input half's
GEMM alone, nn.LSTM; and the default at 4/8/16 torch threads."""
import os, random, statistics, time
import torch, pyroundlib
torch.manual_seed(0)
ROUNDS = int(os.environ.get("ROUNDS", "7"))
def timed(fn, calls):
    fn(); t0 = time.perf_counter()
    for _ in range(calls): fn()
    return (time.perf_counter() - t0) / calls * 1e6
for (T, B, I, S) in [(30, 16, 256, 256), (50, 40, 64, 256), (30, 8, 256, 256), (30, 32, 256, 256), (16, 64, 16, 256)]:
    x = torch.randn(T, B, I); w = torch.randn(3 * S, S + I) * (S + I) ** -0.5; b = torch.randn(3 * S) * 0.1
    h0, c0 = torch.randn(B, S), torch.randn(B, S)
    wr, xr = w.clone().requires_grad_(), x.clone().requires_grad_()
    lstm = torch.nn.LSTM(I, S)
    wx = w[:, S:].contiguous()
    def inference():
        with torch.inference_mode(): return pyroundlib.lltm_sequence(x, w, b, (h0, c0))
    def train():
        o, _ = pyroundlib.lltm_sequence(xr, wr, b, (h0, c0)); o.sum().backward()
    def lstm_inference():
        with torch.inference_mode(): lstm(x)
    def input_half():
        torch.addmm(b, x.view(T * B, I), wx.t())
    v = {"nn.LSTM inference": ({}, lstm_inference), "input half": ({}, input_half),
         "default": ({}, inference), "default fwd+bwd": ({}, train)}
    for n in (1, 2, 4, 8, 16):
        if n <= B: v[f"rows {n}"] = ({"PRL_AB_ROWS": str(n)}, inference)
    for n in (4, 8, 12, 16, 24):
        v[f"steps {n}"] = ({"PRL_AB_STEPS": str(n)}, inference)
    times = {k: [] for k in v}
    calls = max(2, int(1e5 / (T * B * S) * 10))
    for _ in range(ROUNDS):
        order = list(v); random.shuffle(order)
        for k in order:
            env, fn = v[k]
            for e in ("PRL_AB_ROWS", "PRL_AB_STEPS"): os.environ.pop(e, None)
            os.environ.update(env)
            times[k].append(timed(fn, calls))
    for e in ("PRL_AB_ROWS", "PRL_AB_STEPS"): os.environ.pop(e, None)
    r = {k: statistics.median(t) for k, t in times.items()}
    base = r["nn.LSTM inference"]
    print(f"({T},{B},{I},{S}) inference, us (/ nn.LSTM): " + "; ".join(f"{k} {t:.0f} ({t / base:.2f})" for k, t in r.items()), flush=True)
    th = {}
    for n in (4, 8, 16):
        torch.set_num_threads(n)
        th[n] = (statistics.median(timed(inference, calls) for _ in range(5)), statistics.median(timed(lstm_inference, calls) for _ in range(5)))
    torch.set_num_threads(16)
    print(f"  threads: " + "; ".join(f"{n}: ours {a:.0f} nn.LSTM {b:.0f}" for n, (a, b) in th.items()), flush=True)
