"""A CPU sequence's two gradient products alone: the library's (prl_matmul_cpu) against torch.mm,
interleaved rounds, medians of per-round ratios."""
import statistics, time, torch, random
from pyroundlib import sequence


def library_mm(a, b, out, transpose_a=False):
    """out = a @ b (a^T @ b) by prl_matmul_cpu, whatever the CPU."""
    m, n = out.shape
    k = a.shape[0] if transpose_a else a.shape[1]
    sequence._matmul_kernel(out, a.data_ptr(), a.stride(0), int(transpose_a), b.data_ptr(), b.stride(0),
                            out.data_ptr(), out.stride(0), m, n, k, sequence.DTYPE_CODES[out.dtype])
SIZES = [(8,32,8,64),(50,64,64,128),(30,4,256,256),(100,64,256,256),(8,1,256,256),(100,1,256,256),(20,16,32,32),(64,8,128,64),(16,64,16,256),(100,32,64,128),(30,16,256,256),(100,12,64,256)]
def timed(f, reps):
    t = time.perf_counter()
    for _ in range(reps): f()
    return (time.perf_counter() - t) / reps
print(torch.__version__, torch.get_num_threads(), "threads")
for (T,B,I,S) in SIZES:
    R = T*B
    rows = torch.randn(R, 3*S); w = torch.randn(3*S, S+I); x = torch.randn(R, S+I)
    d_in, d_w = torch.empty(R, I), torch.empty(3*S, S+I)
    cases = {"d_input": (lambda: library_mm(rows, w[:, S:], d_in), lambda: torch.mm(rows, w[:, S:], out=d_in), R*3*S*I),
             "d_weights": (lambda: library_mm(rows, x, d_w, transpose_a=True), lambda: torch.mm(rows.t(), x, out=d_w), R*3*S*(S+I))}
    for name, (lib, tor, macs) in cases.items():
        reps = max(1, int(0.01 / max(1e-6, timed(tor, 1))))
        timed(lib, reps); timed(tor, reps)
        a, b = [], []
        for _ in range(15):
            if random.random() < 0.5: a.append(timed(lib, reps)); b.append(timed(tor, reps))
            else: b.append(timed(tor, reps)); a.append(timed(lib, reps))
        print(f"({T},{B},{I},{S}) {name:9s} [{'%d x %d x %d' % ((R, 3*S, I) if name == 'd_input' else (3*S, R, S+I))}] 2^{macs.bit_length()-1}: "
              f"library {statistics.median(a)*1e6:.0f} us, torch {statistics.median(b)*1e6:.0f} us, library/torch {statistics.median(p/q for p,q in zip(a,b)):.3f}", flush=True)
