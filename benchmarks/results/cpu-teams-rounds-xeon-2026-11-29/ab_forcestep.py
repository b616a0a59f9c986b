"""A/B on the CPU, one process: the row split (default at B >= 8 on 16 threads) against the step loop
in rounds (PRL_AB_FORCESTEP), its cells in chunks of PRL_AB_CELLGRAIN rows (32768 gate elements as
built); read per call by a measuring build.
Interleaved rounds, medians of per-round ratios."""
import os, random, statistics, sys, time
import torch, pyroundlib
print("threads", torch.get_num_threads(), torch.__version__, flush=True)
ROUNDS = int(os.environ.get("ROUNDS", 9))
KEYS = ("PRL_AB_OLD", "PRL_AB_NOBLAS", "PRL_AB_STEPWORK", "PRL_AB_SEQWORK", "PRL_AB_FORCESTEP", "PRL_AB_CELLGRAIN")
VARIANTS = {"default": {}, "step": {"PRL_AB_FORCESTEP": 1}, "step cells 4": {"PRL_AB_FORCESTEP": 1, "PRL_AB_CELLGRAIN": 4},
            "step cells 1": {"PRL_AB_FORCESTEP": 1, "PRL_AB_CELLGRAIN": 1}}
if os.environ.get("VARIANTS"):
    VARIANTS = {k: VARIANTS[k] for k in os.environ["VARIANTS"].split(",")}

def timed(fn, calls):
    fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6

def setenv(env):
    for k in KEYS:
        os.environ.pop(k, None)
    for k, v in env.items():
        os.environ[k] = str(v)

rows = [(16, 64, 16, 256), (100, 64, 256, 256), (50, 64, 64, 128), (100, 32, 64, 128), (8, 32, 8, 64), (64, 8, 128, 64),
        (20, 16, 32, 32)]
if os.environ.get("ROWS"):
    rows = [rows[int(i)] for i in os.environ["ROWS"].split(",")]
for (T, B, I, S) in rows:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, B, I, generator=g)
    w = (torch.randn(3 * S, S + I, generator=g) * S ** -0.5).requires_grad_()
    b = torch.randn(3 * S, generator=g).requires_grad_()
    h0, c0 = torch.randn(B, S, generator=g), torch.randn(B, S, generator=g)
    m = torch.nn.LSTM(I, S)
    # the same bits with and without rounds (the library's product); MKL's within rounding
    outs = {}
    for k, env in VARIANTS.items():
        setenv(env)
        out, (h, c) = pyroundlib.lltm_sequence(x, w, b, (h0, c0))
        grads = torch.autograd.grad(out.sum() + c.sum(), (w, b))
        outs[k] = (out, c, *grads)
    setenv({})
    for k in outs:
        for a, r in zip(outs[k], outs[list(outs)[0]]):
            torch.testing.assert_close(a, r, rtol=2e-2, atol=2e-2)  # MKL against the library: rounding apart
    for k in outs:
        assert all(torch.equal(a, r) for a, r in zip(outs[k], outs["default"])), (T, B, I, S, k)
    for mode in ("inference", "fwd+bwd"):
        def ours():
            if mode == "inference":
                with torch.inference_mode():
                    pyroundlib.lltm_sequence(x, w, b, (h0, c0))
            else:
                out, _ = pyroundlib.lltm_sequence(x, w, b, (h0, c0))
                out.sum().backward()
        def lstm():
            if mode == "inference":
                with torch.inference_mode():
                    m(x)
            else:
                out, _ = m(x)
                out.sum().backward()
        calls = 20 if T * B * S < 2 ** 20 else 5
        times = {k: [] for k in list(VARIANTS) + ["nn.LSTM"]}
        for _ in range(ROUNDS):
            order = list(times)
            random.shuffle(order)
            for k in order:
                setenv(VARIANTS.get(k, {}))
                times[k].append(timed(lstm if k == "nn.LSTM" else ours, calls))
        setenv({})
        med = lambda k, ref: statistics.median([a / p for a, p in zip(times[k], times[ref])])
        print(f"{mode} {(T, B, I, S)}: nn.LSTM {statistics.median(times['nn.LSTM']):.0f} us; " + "; ".join(
            f"{k} {statistics.median(times[k]):.0f} us /LSTM {med(k, 'nn.LSTM'):.3f} /default {med(k, 'default'):.3f}"
            for k in VARIANTS), flush=True)
