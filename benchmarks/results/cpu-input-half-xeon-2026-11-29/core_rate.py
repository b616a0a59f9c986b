"""One core's product rate: the library's input half (prl_lltm_input_half_cpu, ctypes) against
torch.mm (MKL / oneDNN), [M, K] x [K, 3S], one thread, medians of 200 calls."""
import ctypes, sys, time, statistics, torch
torch.set_num_threads(1)
lib = ctypes.CDLL(sys.argv[1]); lib.prl_set_cpu_threads(ctypes.c_int64(1))
I64 = ctypes.c_int64; p = lambda t: ctypes.c_void_p(t.data_ptr())
K = S = 256
def med(f, n=200):
    for _ in range(10): f()
    ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return statistics.median(ts)
for M in (1, 2, 4, 6, 12, 48, 480):
    x = torch.randn(M, K); w = torch.randn(3 * S, S + K); b = torch.zeros(3 * S); g = torch.empty(M, 3 * S)
    wx = w[:, S:]; out = torch.empty(M, 3 * S)
    ours = med(lambda: lib.prl_lltm_input_half_cpu(p(x), p(w), p(b), p(g), I64(M), I64(K), I64(S), 0))
    theirs = med(lambda: torch.mm(x, wx.t(), out=out))
    mac = M * K * 3 * S
    print(f"M={M:4d}: library {ours*1e6:8.1f} us {mac/ours/1e9:6.1f} GMAC/s | torch.mm {theirs*1e6:8.1f} us {mac/theirs/1e9:6.1f} GMAC/s", flush=True)
