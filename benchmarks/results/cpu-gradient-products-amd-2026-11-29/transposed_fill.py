import statistics, time, torch
from pyroundlib import sequence


def library_mm(a, b, out, transpose_a=False):
    """out = a @ b (a^T @ b) by prl_matmul_cpu, whatever the CPU."""
    m, n = out.shape
    k = a.shape[0] if transpose_a else a.shape[1]
    sequence._matmul_kernel(out, a.data_ptr(), a.stride(0), int(transpose_a), b.data_ptr(), b.stride(0),
                            out.data_ptr(), out.stride(0), m, n, k, sequence.DTYPE_CODES[out.dtype])
def timed(f, reps=20):
    f(); t = time.perf_counter()
    for _ in range(reps): f()
    return (time.perf_counter() - t) / reps * 1e6
for m, n in [(192, 192), (768, 272)]:
    for k in [448, 480, 512, 544, 1000, 1024, 1056]:
        a = torch.randn(m, k); at = torch.randn(k, m); b = torch.randn(k, n); c = torch.empty(m, n)
        t_n = statistics.median(timed(lambda: library_mm(a, b, c)) for _ in range(5))
        t_t = statistics.median(timed(lambda: library_mm(at, b, c, transpose_a=True)) for _ in range(5))
        t_torch = statistics.median(timed(lambda: torch.mm(at.t(), b, out=c)) for _ in range(5))
        print(f"m={m} n={n} k={k}: plain {t_n:.0f} us, transposed {t_t:.0f} us, torch {t_torch:.0f} us")
