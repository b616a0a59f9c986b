"""A/B on the CPU, one process: the library's team (PRL_AB_TEAM=parts: a region as large as its
parts, else torch's thread count) and the sequence plan's thread cap (PRL_AB_CAP), read per call
by the measuring build tmp-diag/ab/libpyroundlib.so.  Interleaved rounds, medians of per-round ratios."""
import os, random, statistics, sys, time
import torch, pyroundlib
print("threads", torch.get_num_threads(), torch.__version__, pyroundlib.__file__, flush=True)
ROUNDS = int(os.environ.get("ROUNDS", 9))
part = sys.argv[1] if len(sys.argv) > 1 else "all"

def timed(fn, calls):
    fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6

def setenv(**kv):
    for k in ("PRL_AB_TEAM", "PRL_AB_CAP"):
        os.environ.pop(k, None)
    for k, v in kv.items():
        os.environ[k] = str(v)

def compare(label, variants, peer, calls):
    times = {k: [] for k in list(variants) + ["peer"]}
    for _ in range(ROUNDS):
        order = list(variants) + ["peer"]
        random.shuffle(order)
        for k in order:
            if k == "peer":
                setenv(); times[k].append(timed(peer, calls))
            else:
                env, fn = variants[k]
                setenv(**env); times[k].append(timed(fn, calls))
    setenv()
    base = list(variants)[0]
    line = f"{label}: peer {statistics.median(times['peer']):.1f} us; " + "; ".join(
        f"{k} {statistics.median(times[k]):.1f} us (/peer {statistics.median([a / p for a, p in zip(times[k], times['peer'])]):.3f}, /{base} {statistics.median([a / b for a, b in zip(times[k], times[base])]):.3f})"
        for k in variants)
    print(line, flush=True)

if part in ("all", "round"):
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        for n in (1 << 16, 1 << 17, 1 << 18, 1 << 20):
            x = (torch.randn(n) * 4).to(dtype)
            assert torch.equal(pyroundlib.round_ste(x), torch.round(x))
            setenv(PRL_AB_TEAM="parts"); assert torch.equal(pyroundlib.round_ste(x), torch.round(x)); setenv()
            f = lambda: pyroundlib.round_ste(x)
            compare(f"round forward 2^{n.bit_length()-1} {str(dtype)[6:]}", {"team=threads": ({}, f), "team=parts": ({"PRL_AB_TEAM": "parts"}, f)},
                    lambda: torch.round(x), 200)
    # the LLTM cell's pointwise kernels at a large batch, against eager
    from pyroundlib import reference
    B, S = 4096, 256
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, 64, generator=g); w = torch.randn(3 * S, S + 64, generator=g) * 0.05
    bb = torch.randn(3 * S, generator=g); h = torch.randn(B, S, generator=g); c = torch.randn(B, S, generator=g)
    with torch.inference_mode():
        f = lambda: pyroundlib.lltm_cell(x, w, bb, h, c)
        compare("lltm_cell inference (4096,64,256)", {"team=threads": ({}, f), "team=parts": ({"PRL_AB_TEAM": "parts"}, f)},
                lambda: reference.lltm_cell_reference(x, w, bb, h, c), 20)

if part in ("all", "sequence"):
    rows = [(30, 4, 256, 256), (100, 1, 256, 256), (8, 1, 256, 256), (16, 64, 16, 256), (100, 64, 256, 256),
            (50, 64, 64, 128), (8, 32, 8, 64)]
    if os.environ.get("ROWS"):
        rows = rows[:int(os.environ["ROWS"])]
    for (T, B, I, S) in rows:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(T, B, I, generator=g)
        w = (torch.randn(3 * S, S + I, generator=g) * S ** -0.5).requires_grad_()
        b = torch.randn(3 * S, generator=g).requires_grad_()
        h0, c0 = torch.randn(B, S, generator=g), torch.randn(B, S, generator=g)
        m = torch.nn.LSTM(I, S)
        with torch.inference_mode():
            ref = pyroundlib.lltm_sequence(x, w, b, (h0, c0))[0]
            for env in ({"PRL_AB_CAP": 8}, {"PRL_AB_CAP": 8, "PRL_AB_TEAM": "parts"}, {"PRL_AB_TEAM": "parts"}):
                setenv(**env); assert torch.equal(pyroundlib.lltm_sequence(x, w, b, (h0, c0))[0], ref), env
            setenv()
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
            compare(f"sequence {mode} {(T, B, I, S)}", {"default": ({}, ours), "cap8": ({"PRL_AB_CAP": 8}, ours),
                    "cap8+team": ({"PRL_AB_CAP": 8, "PRL_AB_TEAM": "parts"}, ours), "team": ({"PRL_AB_TEAM": "parts"}, ours)},
                    lstm, calls)
