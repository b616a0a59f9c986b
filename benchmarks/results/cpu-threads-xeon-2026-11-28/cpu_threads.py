"""CPU: lltm_sequence at small batches and wide states under torch.set_num_threads(k), against nn.LSTM at
the default threads; interleaved rounds, medians."""
import random, statistics, time, sys
import torch
import pyroundlib

default = torch.get_num_threads()
print("threads", default, torch.__version__, flush=True)
ROUNDS = 7


def timed(fn, calls):
    fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


for (T, B, I, S) in [(100, 1, 256, 256), (30, 4, 256, 256), (8, 1, 256, 256), (16, 64, 16, 256), (100, 64, 256, 256)]:
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
                    pyroundlib.lltm_sequence(x, w, b, (h0, c0))
            else:
                out, (h, c) = pyroundlib.lltm_sequence(x, w, b, (h0, c0))
                out.sum().backward()

        def lstm():
            if mode == "inference":
                with torch.inference_mode():
                    m(x)
            else:
                out, _ = m(x)
                out.sum().backward()
        calls = 20 if T * B * S < 2 ** 20 else 5
        settings = [1, 2, 4, 8, default]
        times = {k: [] for k in settings + ["lstm"]}
        for _ in range(ROUNDS):
            order = settings + ["lstm"]
            random.shuffle(order)
            for k in order:
                if k == "lstm":
                    torch.set_num_threads(default)
                    times[k].append(timed(lstm, calls))
                else:
                    torch.set_num_threads(k)
                    times[k].append(timed(ours, calls))
        torch.set_num_threads(default)
        lst = statistics.median(times["lstm"])
        print(f"{(T, B, I, S)} {mode}: nn.LSTM({default}) {lst:.0f} us; ours " + ", ".join(
            f"{k}t {statistics.median(times[k]):.0f} ({statistics.median([a / l for a, l in zip(times[k], times['lstm'])]):.3f})"
            for k in settings), flush=True)
