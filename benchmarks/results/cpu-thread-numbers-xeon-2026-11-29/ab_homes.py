"""A/B, one process, on a measuring build whose switch PRL_AB_HOMES (read every call) chose which
thread of torch's OpenMP team runs which part of a library region: =omp: thread m first takes part m
(omp_get_thread_num), then claims the rest in order; =static: thread m runs parts m, m + team, ...
and nothing else (as built since); =arrival: a home number by first arrival, used where parts ==
threads, the rest claimed in order (as built before).  Interleaved rounds in a fresh random order,
medians; "alternating": each call right after a torch.round of the same input."""
import os, random, statistics, sys, time
import torch, pyroundlib
from pyroundlib import _threads
torch.manual_seed(0)
print("threads", torch.get_num_threads(), torch.__version__, "thread_num given:", _threads.openmp_runtime(), flush=True)
MODES = ("omp", "static", "arrival")
ROUNDS = int(os.environ.get("ROUNDS", "11"))
def timed(fn, calls):
    fn(); t0 = time.perf_counter()
    for _ in range(calls): fn()
    return (time.perf_counter() - t0) / calls * 1e6
def alternating(fn, calls):  # torch.round(x) then ours, call after call; ours timed alone
    total = 0.0
    for _ in range(calls):
        torch.round(X[0]); t0 = time.perf_counter(); fn(); total += time.perf_counter() - t0
    return total / calls * 1e6
def run(variants, calls, rounds=ROUNDS):
    times = {k: [] for k in variants}
    for _ in range(rounds):
        order = list(variants); random.shuffle(order)
        for k in order:
            mode, timer, fn = variants[k]
            os.environ["PRL_AB_HOMES"] = mode
            times[k].append(timer(fn, calls))
    return {k: statistics.median(v) for k, v in times.items()}
X = [None]
if "round" in sys.argv[1:] or len(sys.argv) == 1:
    for dtype, sizes in ((torch.float32, (16, 17, 18, 19, 20, 21, 22)), (torch.bfloat16, (18, 20, 22)), (torch.float64, (18, 20))):
        for e in sizes:
            x = torch.randn(1 << e, dtype=dtype); X[0] = x
            calls = 200 if e <= 20 else 50
            v = {}
            for m in MODES:
                v[f"chain {m}"] = (m, timed, lambda: pyroundlib.round_ste(torch.sigmoid(x) * 3).mul_(2))
                v[f"alone {m}"] = (m, timed, lambda: pyroundlib.round_ste(x))
                v[f"alternating {m}"] = (m, alternating, lambda: pyroundlib.round_ste(x))
            v["chain torch"] = ("omp", timed, lambda: torch.round(torch.sigmoid(x) * 3).mul_(2))
            v["alone torch"] = ("omp", timed, lambda: torch.round(x))
            v["alternating torch"] = ("omp", alternating, lambda: torch.round(x))
            r = run(v, calls)
            line = []
            for s in ("chain", "alone", "alternating"):
                t = r[f"{s} torch"]
                line.append(f"{s}: torch {t:.1f} us; " + ", ".join(f"{m} {r[f'{s} {m}']:.1f} ({r[f'{s} {m}'] / t:.2f})" for m in MODES))
            print(f"2^{e} {str(dtype)[6:]}: " + " | ".join(line), flush=True)
if "sequence" in sys.argv[1:] or len(sys.argv) == 1:
    for (T, B, I, S) in ((16, 64, 16, 256), (100, 64, 256, 256), (50, 64, 64, 128), (8, 32, 8, 64), (30, 4, 256, 256), (100, 1, 256, 256)):
        x = torch.randn(T, B, I); w = torch.randn(3 * S, S + I) * (S + I) ** -0.5; b = torch.randn(3 * S) * 0.1
        h0 = torch.randn(B, S); c0 = torch.randn(B, S)
        wr = w.clone().requires_grad_(); xr = x.clone().requires_grad_()
        lstm = torch.nn.LSTM(I, S)
        def inf():
            with torch.inference_mode(): pyroundlib.lltm_sequence(x, w, b, (h0, c0))
        def train():
            o, _ = pyroundlib.lltm_sequence(xr, wr, b, (h0, c0)); o.sum().backward()
        def linf():
            with torch.inference_mode(): lstm(x)
        def ltrain():
            o, _ = lstm(xr); o.sum().backward()
        v = {}
        for m in MODES:
            v[f"inf {m}"] = (m, timed, inf); v[f"train {m}"] = (m, timed, train)
        v["inf lstm"] = ("omp", timed, linf); v["train lstm"] = ("omp", timed, ltrain)
        r = run(v, 5, ROUNDS)
        line = []
        for s in ("inf", "train"):
            t = r[f"{s} lstm"]
            line.append(f"{s}: lstm {t:.0f} us; " + ", ".join(f"{m} {r[f'{s} {m}']:.0f} ({r[f'{s} {m}'] / t:.3f})" for m in MODES))
        print(f"({T},{B},{I},{S}): " + " | ".join(line), flush=True)
