import statistics, time, torch
from pyroundlib import sequence
def timed(f, reps=20):
    f(); t = time.perf_counter()
    for _ in range(reps): f()
    return (time.perf_counter() - t) / reps * 1e6
for m, n in [(192, 192), (768, 272)]:
    for k in [448, 480, 512, 544, 1000, 1024, 1056]:
        a = torch.randn(m, k); at = torch.randn(k, m); b = torch.randn(k, n); c = torch.empty(m, n)
        t_n = statistics.median(timed(lambda: sequence._library_mm(a, b, c)) for _ in range(5))
        t_t = statistics.median(timed(lambda: sequence._library_mm(at, b, c, transpose_a=True)) for _ in range(5))
        t_torch = statistics.median(timed(lambda: torch.mm(at.t(), b, out=c)) for _ in range(5))
        print(f"m={m} n={n} k={k}: plain {t_n:.0f} us, transposed {t_t:.0f} us, torch {t_torch:.0f} us")
