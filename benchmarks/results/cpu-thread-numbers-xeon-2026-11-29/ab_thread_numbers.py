"""With and without the runner's thread numbers, one process: prl_set_cpu_thread_num given
omp_get_thread_num (thread m of torch's OpenMP team runs part m, pyroundlib's default) or NULL
(every thread claims the next part).  round_ste against torch.round in three settings: in a chain
of torch ops (sigmoid(x) * 3 -> round -> mul_), alone call after call, and each call right
after a torch.round of the same input; lltm_sequence against nn.LSTM.  Interleaved rounds in a
fresh random order, medians; ratio to torch's time in brackets."""
import os, random, statistics, sys, time
import torch, pyroundlib
from pyroundlib import _ffi, _threads
torch.manual_seed(0)
_threads.follow_torch()
LIB = _ffi.library()
NUMBERS = _threads._given["thread_num"]
assert NUMBERS, "no omp_get_thread_num found"
MODES = {"numbers": NUMBERS, "no numbers": None}
ROUNDS = int(os.environ.get("ROUNDS", "11"))
print("threads", torch.get_num_threads(), "torch", torch.__version__, "pyroundlib", pyroundlib.__version__, flush=True)
X = [None]


def timed(fn, calls):
    fn(); t0 = time.perf_counter()
    for _ in range(calls): fn()
    return (time.perf_counter() - t0) / calls * 1e6


def after_torch_round(fn, calls):  # torch.round(x), then ours, call after call; ours timed alone
    total = 0.0
    for _ in range(calls):
        torch.round(X[0]); t0 = time.perf_counter(); fn(); total += time.perf_counter() - t0
    return total / calls * 1e6


def run(variants, calls):
    times = {k: [] for k in variants}
    for _ in range(ROUNDS):
        order = list(variants); random.shuffle(order)
        for k in order:
            mode, timer, fn = variants[k]
            LIB.prl_set_cpu_thread_num(MODES[mode])
            times[k].append(timer(fn, calls))
    LIB.prl_set_cpu_thread_num(NUMBERS)
    return {k: statistics.median(v) for k, v in times.items()}


def report(label, r, settings, peer):
    parts = []
    for s in settings:
        t = r[f"{s} {peer}"]
        parts.append(f"{s}: {peer} {t:.1f}; " + ", ".join(f"{m} {r[f'{s} {m}']:.1f} ({r[f'{s} {m}'] / t:.3f})" for m in MODES)
                     + f"; numbers / none {r[f'{s} numbers'] / r[f'{s} no numbers']:.3f}")
    print(f"{label}: " + " | ".join(parts), flush=True)


if "round" in sys.argv[1:] or len(sys.argv) == 1:
    for dtype, sizes in ((torch.float32, (16, 17, 18, 19, 20, 21, 22)), (torch.bfloat16, (16, 18, 20, 22)),
                         (torch.float64, (16, 18, 20))):
        for e in sizes:
            x = torch.randn(1 << e, dtype=dtype); X[0] = x
            v = {}
            for m in MODES:
                v[f"chain {m}"] = (m, timed, lambda: pyroundlib.round_ste(torch.sigmoid(x) * 3).mul_(2))
                v[f"alone {m}"] = (m, timed, lambda: pyroundlib.round_ste(x))
                v[f"after torch.round {m}"] = (m, after_torch_round, lambda: pyroundlib.round_ste(x))
            v["chain torch"] = ("numbers", timed, lambda: torch.round(torch.sigmoid(x) * 3).mul_(2))
            v["alone torch"] = ("numbers", timed, lambda: torch.round(x))
            v["after torch.round torch"] = ("numbers", after_torch_round, lambda: torch.round(x))
            report(f"2^{e} {str(dtype)[6:]}, us", run(v, 200 if e <= 20 else 50), ("chain", "alone", "after torch.round"), "torch")
if "sequence" in sys.argv[1:] or len(sys.argv) == 1:
    for (T, B, I, S) in ((8, 32, 8, 64), (50, 64, 64, 128), (30, 4, 256, 256), (100, 64, 256, 256), (100, 1, 256, 256),
                         (16, 64, 16, 256)):
        x = torch.randn(T, B, I); w = torch.randn(3 * S, S + I) * (S + I) ** -0.5; b = torch.randn(3 * S) * 0.1
        h0, c0 = torch.randn(B, S), torch.randn(B, S)
        wr, xr = w.clone().requires_grad_(), x.clone().requires_grad_()
        lstm = torch.nn.LSTM(I, S)

        def inference():
            with torch.inference_mode(): pyroundlib.lltm_sequence(x, w, b, (h0, c0))

        def train():
            o, _ = pyroundlib.lltm_sequence(xr, wr, b, (h0, c0)); o.sum().backward()

        def lstm_inference():
            with torch.inference_mode(): lstm(x)

        def lstm_train():
            o, _ = lstm(xr); o.sum().backward()
        v = {}
        for m in MODES:
            v[f"inference {m}"] = (m, timed, inference); v[f"fwd+bwd {m}"] = (m, timed, train)
        v["inference nn.LSTM"] = ("numbers", timed, lstm_inference); v["fwd+bwd nn.LSTM"] = ("numbers", timed, lstm_train)
        report(f"({T},{B},{I},{S}), us", run(v, 5), ("inference", "fwd+bwd"), "nn.LSTM")
