"""A/B, one process: the rows left over a 6-row tile (3-5: a 16-thread split of 64 rows gives 4-row
parts) swept two column panels at a time (PRL_AB_WIDE=1) or one (as built).  lltm_sequence against
nn.LSTM, interleaved rounds, medians; outputs compared bit for bit."""
import os, random, statistics, sys, time
import torch, pyroundlib
torch.manual_seed(0)
ROUNDS = int(os.environ.get("ROUNDS", "11"))
print("threads", torch.get_num_threads(), torch.__version__, flush=True)
def timed(fn, calls):
    fn(); t0 = time.perf_counter()
    for _ in range(calls): fn()
    return (time.perf_counter() - t0) / calls * 1e6
SIZES = [(16, 64, 16, 256), (100, 64, 256, 256), (50, 64, 64, 128), (8, 32, 8, 64), (100, 32, 64, 128), (64, 8, 128, 64), (30, 16, 256, 256), (50, 40, 64, 256)]
for (T, B, I, S) in SIZES:
    x = torch.randn(T, B, I); w = torch.randn(3 * S, S + I) * (S + I) ** -0.5; b = torch.randn(3 * S) * 0.1
    h0, c0 = torch.randn(B, S), torch.randn(B, S)
    wr, xr = w.clone().requires_grad_(), x.clone().requires_grad_()
    lstm = torch.nn.LSTM(I, S)
    def inference():
        with torch.inference_mode(): return pyroundlib.lltm_sequence(x, w, b, (h0, c0))
    def train():
        o, _ = pyroundlib.lltm_sequence(xr, wr, b, (h0, c0)); o.sum().backward(); return o
    outs = {}
    for m in "01":
        os.environ["PRL_AB_WIDE"] = m
        o, (h, c) = inference(); xr.grad = None; wr.grad = None
        ot = train(); outs[m] = (o, c, ot.detach(), xr.grad.clone(), wr.grad.clone())
    same = all(torch.equal(a, b) for a, b in zip(outs["0"], outs["1"]))
    def lstm_inference():
        with torch.inference_mode(): lstm(x)
    def lstm_train():
        o, _ = lstm(xr); o.sum().backward()
    v = {"inference one": ("0", inference), "inference two": ("1", inference), "inference nn.LSTM": ("0", lstm_inference),
         "fwd+bwd one": ("0", train), "fwd+bwd two": ("1", train), "fwd+bwd nn.LSTM": ("0", lstm_train)}
    times = {k: [] for k in v}
    calls = max(2, int(2e5 / (T * B * S)))
    for _ in range(ROUNDS):
        order = list(v); random.shuffle(order)
        for k in order:
            os.environ["PRL_AB_WIDE"] = v[k][0]
            times[k].append(timed(v[k][1], calls))
    r = {k: statistics.median(t) for k, t in times.items()}
    print(f"({T},{B},{I},{S}) same bits {same}: " + " | ".join(
        f"{s}: nn.LSTM {r[s + ' nn.LSTM']:.0f} us, one panel {r[s + ' one']:.0f} ({r[s + ' one'] / r[s + ' nn.LSTM']:.3f}), "
        f"two {r[s + ' two']:.0f} ({r[s + ' two'] / r[s + ' nn.LSTM']:.3f}); two / one {r[s + ' two'] / r[s + ' one']:.3f}"
        for s in ("inference", "fwd+bwd")), flush=True)
