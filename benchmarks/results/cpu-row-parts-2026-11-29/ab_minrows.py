"""A/B, one process: the row split's smallest part (PRL_AB_MINROWS=1: parts of one row or more, each
with 2^21 multiply-adds over the sequence; unset: 4 rows, as built).  lltm_sequence inference and
fwd+bwd against nn.LSTM, interleaved rounds, medians; outputs compared bit for bit."""
import os, random, statistics, sys, time
import torch, pyroundlib
torch.manual_seed(0)
ROUNDS = int(os.environ.get("ROUNDS", "9"))
print("threads", torch.get_num_threads(), torch.__version__, flush=True)
def timed(fn, calls):
    fn(); t0 = time.perf_counter()
    for _ in range(calls): fn()
    return (time.perf_counter() - t0) / calls * 1e6
SIZES = [(30, 16, 256, 256), (30, 8, 256, 256), (30, 32, 256, 256), (50, 40, 64, 256), (100, 8, 128, 128),
         (30, 4, 256, 256), (50, 2, 64, 512), (100, 12, 64, 256), (8, 32, 8, 64), (50, 64, 64, 128),
         (100, 64, 256, 256), (16, 64, 16, 256), (20, 16, 32, 32), (64, 8, 128, 64), (100, 32, 64, 128)]
if len(sys.argv) > 1: SIZES = SIZES[:int(sys.argv[1])]
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
    for m in ("4", "1"):
        os.environ["PRL_AB_MINROWS"] = m
        o, (h, c) = inference(); xr.grad = None; wr.grad = None
        ot = train(); outs[m] = (o, c, ot.detach(), xr.grad.clone(), wr.grad.clone())
    same = all(torch.equal(a, b) for a, b in zip(outs["4"], outs["1"]))
    def lstm_inference():
        with torch.inference_mode(): lstm(x)
    def lstm_train():
        o, _ = lstm(xr); o.sum().backward()
    v = {"inference 4": ("4", inference), "inference 1": ("1", inference), "inference nn.LSTM": ("4", lstm_inference),
         "fwd+bwd 4": ("4", train), "fwd+bwd 1": ("1", train), "fwd+bwd nn.LSTM": ("4", lstm_train)}
    times = {k: [] for k in v}
    calls = max(2, int(1e6 / (T * B * S)))
    for _ in range(ROUNDS):
        order = list(v); random.shuffle(order)
        for k in order:
            os.environ["PRL_AB_MINROWS"] = v[k][0]
            times[k].append(timed(v[k][1], calls))
    r = {k: statistics.median(t) for k, t in times.items()}
    print(f"({T},{B},{I},{S}) same bits {same}: " + " | ".join(
        f"{s}: nn.LSTM {r[s + ' nn.LSTM']:.0f} us, 4 rows {r[s + ' 4']:.0f} ({r[s + ' 4'] / r[s + ' nn.LSTM']:.3f}), "
        f"1 row {r[s + ' 1']:.0f} ({r[s + ' 1'] / r[s + ' nn.LSTM']:.3f}); 1 / 4 {r[s + ' 1'] / r[s + ' 4']:.3f}"
        for s in ("inference", "fwd+bwd")), flush=True)
