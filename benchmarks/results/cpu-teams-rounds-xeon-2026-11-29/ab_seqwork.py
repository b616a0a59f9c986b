"""A/B on the CPU, one process: MKL's step products (default, B <= 4) against the library's in
rounds (PRL_AB_NOBLAS), with smaller column parts of a step (PRL_AB_STEPWORK=log2 multiply-adds a
step, PRL_AB_SEQWORK=log2 over the sequence; 16 and 21 as built); read per call by a measuring build.
Interleaved rounds, medians of per-round ratios."""
import os, random, statistics, sys, time
import torch, pyroundlib
print("threads", torch.get_num_threads(), torch.__version__, flush=True)
ROUNDS = int(os.environ.get("ROUNDS", 9))
KEYS = ("PRL_AB_OLD", "PRL_AB_NOBLAS", "PRL_AB_STEPWORK", "PRL_AB_SEQWORK")
VARIANTS = {"default": {}, "own": {"PRL_AB_NOBLAS": 1},
            "own 13/17": {"PRL_AB_NOBLAS": 1, "PRL_AB_STEPWORK": 13, "PRL_AB_SEQWORK": 17},
            "own 12/15": {"PRL_AB_NOBLAS": 1, "PRL_AB_STEPWORK": 12, "PRL_AB_SEQWORK": 15},
            "own 11/13": {"PRL_AB_NOBLAS": 1, "PRL_AB_STEPWORK": 11, "PRL_AB_SEQWORK": 13},
            "own 10/10": {"PRL_AB_NOBLAS": 1, "PRL_AB_STEPWORK": 10, "PRL_AB_SEQWORK": 10}}
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

rows = [(30, 4, 256, 256), (100, 1, 256, 256), (8, 1, 256, 256), (50, 4, 128, 128), (16, 3, 16, 256), (100, 2, 64, 512),
        (100, 1, 64, 128), (20, 4, 32, 64), (8, 2, 8, 256)]
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
        if k.startswith("own"):
            assert all(torch.equal(a, r) for a, r in zip(outs[k], outs["own"])), (T, B, I, S, k)
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
