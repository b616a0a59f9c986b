"""lltm_sequence on torch's threads with its products as the machine's default (env "") and all in
the library (PYROUNDLIB_CPU_BLAS=0), beside nn.LSTM, interleaved rounds, medians (us)."""
import os, sys, time, statistics, random, torch, pyroundlib
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
print("threads", torch.get_num_threads(), "library", os.environ.get("PYROUNDLIB_LIBRARY"), flush=True)
SIZES = [(30,16,256,256), (100,12,64,256), (50,64,64,128), (100,64,256,256), (30,4,256,256), (100,32,64,128), (8,32,8,64), (16,64,16,256)]
def med(f, n):
    ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return statistics.median(ts)
for T, B, I, S in SIZES:
    torch.manual_seed(0)
    x = torch.randn(T, B, I); w = (torch.randn(3*S, S+I) * 0.1); b = torch.randn(3*S) * 0.1
    h0 = torch.randn(B, S); c0 = torch.randn(B, S); lstm = torch.nn.LSTM(I, S)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    def ours_inf():
        with torch.inference_mode(): pyroundlib.lltm_sequence(x, w, b, (h0, c0))
    def ours_fb():
        o, (h, c) = pyroundlib.lltm_sequence(xg, wg, b, (h0, c0)); (o.sum() + c.sum()).backward()
    def lstm_inf():
        with torch.inference_mode(): lstm(x, (h0[None], c0[None]))
    def lstm_fb():
        o, (h, c) = lstm(xg, (h0[None], c0[None])); (o.sum() + c.sum()).backward()
    n = max(3, int(2e5 / (T * B * S)))
    for mode, o, l in (("inference", ours_inf, lstm_inf), ("fwd+bwd", ours_fb, lstm_fb)):
        cases = {"lstm": (l, None), "default": (o, ""), "blas0": (o, "0")}
        res = {k: [] for k in cases}
        for k, (f, env) in cases.items():
            os.environ["PYROUNDLIB_CPU_BLAS"] = env or ""; f(); f()
        for r in range(rounds):
            ks = list(cases); random.shuffle(ks)
            for k in ks:
                f, env = cases[k]
                if env is not None: os.environ["PYROUNDLIB_CPU_BLAS"] = env
                res[k].append(med(f, n))
        os.environ["PYROUNDLIB_CPU_BLAS"] = ""
        m = {k: statistics.median(v) * 1e6 for k, v in res.items()}
        print(f"({T},{B},{I},{S}) {mode:9s} lstm {m['lstm']:9.1f} | default {m['default']:9.1f} ({m['default']/m['lstm']:.3f}) | "
              f"BLAS=0 {m['blas0']:9.1f} ({m['blas0']/m['lstm']:.3f}) | BLAS=0/default {m['blas0']/m['default']:.3f}", flush=True)
