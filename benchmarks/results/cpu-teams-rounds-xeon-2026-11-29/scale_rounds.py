import os, statistics, time, sys
import torch, pyroundlib
def timed(fn, calls):
    fn(); t0 = time.perf_counter()
    for _ in range(calls): fn()
    return (time.perf_counter() - t0) / calls * 1e6
for (T, B, I, S) in [(100, 1, 256, 256), (30, 4, 256, 256)]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, B, I, generator=g); w = torch.randn(3 * S, S + I, generator=g) * S ** -0.5
    b = torch.randn(3 * S, generator=g); h0, c0 = torch.randn(B, S, generator=g), torch.randn(B, S, generator=g)
    def ours():
        with torch.inference_mode():
            pyroundlib.lltm_sequence(x, w, b, (h0, c0))
    m = torch.nn.LSTM(I, S)
    def lstm():
        with torch.inference_mode():
            m(x)
    gates = torch.nn.functional.linear(x, w[:, S:], b)
    def ih():
        with torch.inference_mode():
            torch.nn.functional.linear(x, w[:, S:], b)
    for env in ({}, {"PRL_AB_NOBLAS": "1"}, {"PRL_AB_NOBLAS": "1", "PRL_AB_OLD": "1"}, {"PRL_AB_NOBLAS": "1", "PRL_AB_STEPWORK": "13"}, {"PRL_AB_NOBLAS": "1", "PRL_AB_STEPWORK": "11"}):
        for k in ("PRL_AB_NOBLAS", "PRL_AB_OLD", "PRL_AB_STEPWORK"): os.environ.pop(k, None)
        os.environ.update(env)
        line = []
        for threads in (1, 2, 4, 8, 16):
            torch.set_num_threads(threads)
            t = statistics.median(timed(ours, 20) for _ in range(5))
            line.append(f"{threads}t {t:.0f}")
        print((T, B, I, S), env, "ours inference us:", ", ".join(line), flush=True)
    for k in ("PRL_AB_NOBLAS", "PRL_AB_OLD", "PRL_AB_STEPWORK"): os.environ.pop(k, None)
    torch.set_num_threads(16)
    print((T, B, I, S), "16t nn.LSTM", f"{statistics.median(timed(lstm, 20) for _ in range(5)):.0f}", "input half", f"{statistics.median(timed(ih, 50) for _ in range(5)):.1f}", flush=True)
