"""CPU, Intel: lltm_sequence at B <= 4 with MKL's thread-local thread count (mkl_set_num_threads_local,
if libtorch_cpu exports it) set around the call, torch at its default threads; against nn.LSTM."""
import ctypes, os, random, statistics, time
import torch
import pyroundlib
from pyroundlib import _threads

paths = _threads.loaded_libraries(_threads._BLAS)
print("blas libraries:", paths, flush=True)
fn = None
for p in paths:
    for name in ("MKL_Set_Num_Threads_Local",):
        a = _threads.symbol_address(p, name)
        print(p, name, a, flush=True)
        if a and fn is None:
            fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(a)
if fn is None:
    raise SystemExit("no mkl_set_num_threads_local")
default = torch.get_num_threads()
print("threads", default, flush=True)


def timed(f, calls):
    f()
    t0 = time.perf_counter()
    for _ in range(calls):
        f()
    return (time.perf_counter() - t0) / calls * 1e6


for (T, B, I, S) in [(8, 1, 256, 256), (30, 4, 256, 256), (100, 1, 256, 256), (30, 4, 8, 256)]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, B, I, generator=g)
    w = (torch.randn(3 * S, S + I, generator=g) * S ** -0.5).requires_grad_()
    b = torch.randn(3 * S, generator=g).requires_grad_()
    h0, c0 = torch.randn(B, S, generator=g), torch.randn(B, S, generator=g)
    m = torch.nn.LSTM(I, S)
    for mode in ("inference", "fwd+bwd"):
        def ours():
            if mode == "inference":
                with torch.inference_mode():
                    return pyroundlib.lltm_sequence(x, w, b, (h0, c0))
            out, (h, c) = pyroundlib.lltm_sequence(x, w, b, (h0, c0))
            out.sum().backward()

        def lstm():
            if mode == "inference":
                with torch.inference_mode():
                    m(x)
            else:
                out, _ = m(x)
                out.sum().backward()
        settings = [0, 1, 2, 4, 8]
        times = {k: [] for k in settings + ["lstm"]}
        ref = None
        for _ in range(7):
            order = settings + ["lstm"]
            random.shuffle(order)
            for k in order:
                if k == "lstm":
                    times[k].append(timed(lstm, 10))
                else:
                    fn(k)  # 0: MKL's own choice (its global setting)
                    times[k].append(timed(ours, 10))
                    fn(0)
        fn(3)
        with torch.inference_mode():
            o3 = pyroundlib.lltm_sequence(x, w, b, (h0, c0))[0]
        fn(0)
        with torch.inference_mode():
            o0 = pyroundlib.lltm_sequence(x, w, b, (h0, c0))[0]
        lst = statistics.median(times["lstm"])
        print(f"{(T, B, I, S)} {mode}: nn.LSTM {lst:.0f} us; ours MKL-local " + ", ".join(
            f"{k}: {statistics.median(times[k]):.0f} ({statistics.median([a / l for a, l in zip(times[k], times['lstm'])]):.3f})"
            for k in settings) + f"; same bits at 3 and default threads: {torch.equal(o3, o0)}", flush=True)
