"""A/B of the CPU sequence loop's routes in one process, `lltm_sequence` float32 against nn.LSTM, 16
threads, interleaved rounds, medians of per-round ratios.  The switches exist only in measuring builds
of the library (the .patch files) and are read on every call:

  PRL_AB_OLD        the step loop's two fork-joins a step instead of rounds of one region
  PRL_AB_NOBLAS     the library's product where MKL's would run (B <= 4 on Intel)
  PRL_AB_STEPWORK   2^k multiply-adds the smallest column part of a step (16 as built)
  PRL_AB_SEQWORK    2^k multiply-adds the smallest part over the sequence (21 as built)
  PRL_AB_FORCESTEP  the step loop where the plan splits by rows
  PRL_AB_CELLGRAIN  rows a cell part of the step loop (32768 gate elements as built)

python3 ab_step_loop.py {rounds,seqwork,forcestep}, with PYROUNDLIB_LIBRARY at the measuring build;
ROUNDS (9), ROWS (indices into the set's rows) and VARIANTS (names) narrow a run."""
import os, random, statistics, sys, time
import torch, pyroundlib

SETS = {
    # ab-rounds.patch: rounds against fork-joins, MKL against the library's product
    "rounds": ({"default": {}, "old": {"PRL_AB_OLD": 1}, "noblas": {"PRL_AB_NOBLAS": 1},
                "noblas+old": {"PRL_AB_NOBLAS": 1, "PRL_AB_OLD": 1},
                "noblas+sw14": {"PRL_AB_NOBLAS": 1, "PRL_AB_STEPWORK": 14},
                "noblas+sw12": {"PRL_AB_NOBLAS": 1, "PRL_AB_STEPWORK": 12}},
               [(30, 4, 256, 256), (100, 1, 256, 256), (8, 1, 256, 256), (50, 4, 128, 128), (16, 3, 16, 256),
                (100, 2, 64, 512), (8, 32, 8, 64), (64, 8, 128, 64), (16, 64, 16, 256), (20, 8, 64, 512),
                (50, 16, 256, 1024)], ("noblas", "noblas+old")),
    # ab-seqwork.patch: MKL against the library's product in rounds with smaller parts
    "seqwork": ({"default": {}, "own": {"PRL_AB_NOBLAS": 1},
                 **{f"own {s}/{q}": {"PRL_AB_NOBLAS": 1, "PRL_AB_STEPWORK": s, "PRL_AB_SEQWORK": q}
                    for s, q in ((13, 17), (12, 15), (11, 13), (10, 10))}},
                [(30, 4, 256, 256), (100, 1, 256, 256), (8, 1, 256, 256), (50, 4, 128, 128), (16, 3, 16, 256),
                 (100, 2, 64, 512), (100, 1, 64, 128), (20, 4, 32, 64), (8, 2, 8, 256)], ("own", "own *")),
    # ab-forcestep.patch: the row split against the step loop in rounds at B >= 8
    "forcestep": ({"default": {}, "step": {"PRL_AB_FORCESTEP": 1},
                   "step cells 4": {"PRL_AB_FORCESTEP": 1, "PRL_AB_CELLGRAIN": 4},
                   "step cells 1": {"PRL_AB_FORCESTEP": 1, "PRL_AB_CELLGRAIN": 1}},
                  [(16, 64, 16, 256), (100, 64, 256, 256), (50, 64, 64, 128), (100, 32, 64, 128), (8, 32, 8, 64),
                   (64, 8, 128, 64), (20, 16, 32, 32)], ("default", "*")),
}
KEYS = ("PRL_AB_OLD", "PRL_AB_NOBLAS", "PRL_AB_STEPWORK", "PRL_AB_SEQWORK", "PRL_AB_FORCESTEP", "PRL_AB_CELLGRAIN")
variants, rows, (same_as, same) = SETS[sys.argv[1]]
if os.environ.get("VARIANTS"):
    variants = {k: variants[k] for k in os.environ["VARIANTS"].split(",")}
if os.environ.get("ROWS"):
    rows = [rows[int(i)] for i in os.environ["ROWS"].split(",")]
ROUNDS = int(os.environ.get("ROUNDS", 9))
print("threads", torch.get_num_threads(), torch.__version__, flush=True)


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


for (T, B, I, S) in rows:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, B, I, generator=g)
    w = (torch.randn(3 * S, S + I, generator=g) * S ** -0.5).requires_grad_()
    b = torch.randn(3 * S, generator=g).requires_grad_()
    h0, c0 = torch.randn(B, S, generator=g), torch.randn(B, S, generator=g)
    m = torch.nn.LSTM(I, S)
    outs = {}
    for k, env in variants.items():
        setenv(env)
        out, (h, c) = pyroundlib.lltm_sequence(x, w, b, (h0, c0))
        outs[k] = (out, c, *torch.autograd.grad(out.sum() + c.sum(), (w, b)))
    setenv({})
    first = list(outs)[0]
    for k in outs:  # MKL against the library: rounding apart; the library's routes: the same bits
        for a, r in zip(outs[k], outs[first]):
            torch.testing.assert_close(a, r, rtol=2e-2, atol=2e-2)
        if same_as in outs and (k == same or (same.endswith("*") and k.startswith(same[:-1]))):
            assert all(torch.equal(a, r) for a, r in zip(outs[k], outs[same_as])), (T, B, I, S, k)
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
        times = {k: [] for k in list(variants) + ["nn.LSTM"]}
        for _ in range(ROUNDS):
            order = list(times)
            random.shuffle(order)
            for k in order:
                setenv(variants.get(k, {}))
                times[k].append(timed(lstm if k == "nn.LSTM" else ours, calls))
        setenv({})
        med = lambda k, ref: statistics.median([a / p for a, p in zip(times[k], times[ref])])
        print(f"{mode} {(T, B, I, S)}: nn.LSTM {statistics.median(times['nn.LSTM']):.0f} us; " + "; ".join(
            f"{k} {statistics.median(times[k]):.0f} us /LSTM {med(k, 'nn.LSTM'):.3f} /default {med(k, 'default'):.3f}"
            for k in variants), flush=True)
