"""On an Intel CPU: lltm_sequence at B <= 4 with each step's product by torch's BLAS (MKL sgemm_,
the default there) against the library's own product, toggled in one process, interleaved rounds."""
import random, statistics, time, sys, torch, pyroundlib
from pyroundlib import _ffi, _threads
SIZES = [(30,4,256,256), (100,1,256,256), (8,1,256,256), (50,2,64,512), (30,4,8,256), (100,1,64,128),
         (50,4,128,128), (200,1,32,64), (16,3,16,256), (64,4,128,64)]
torch.manual_seed(0)
lib = _ffi.library()
x0 = torch.randn(4, 4)
pyroundlib.lltm_sequence(torch.randn(2, 1, 4), torch.randn(12, 8), torch.randn(12), (torch.zeros(1, 4), torch.zeros(1, 4)))
gemm = _threads._given["gemm"]
print("torch", torch.__version__, "threads", torch.get_num_threads(), "BLAS handed:", gemm, flush=True)
assert gemm and gemm[0], "no BLAS on this machine"
def use(blas):
    lib.prl_set_cpu_gemm(*(gemm if blas else (None, None)))
for (T, B, I, S) in SIZES:
    x = torch.randn(T, B, I); w = torch.randn(3 * S, S + I) / S ** 0.5; b = torch.randn(3 * S)
    h0, c0 = torch.randn(B, S), torch.randn(B, S)
    wr = w.clone().requires_grad_()
    def infer():
        with torch.inference_mode():
            pyroundlib.lltm_sequence(x, w, b, (h0, c0))
    def train():
        out, (h, c) = pyroundlib.lltm_sequence(x, wr, b, (h0, c0))
        torch.autograd.grad(out.sum(), wr)
    for kind, run in (("inference", infer), ("fwd+bwd", train)):
        n = max(3, int(2e6 // (T * B * S * S * 3 // 1000 + 1)) // 10)
        n = min(n, 50)
        def timed():
            ts = []
            for _ in range(5):
                t = time.perf_counter()
                for _ in range(n): run()
                ts.append((time.perf_counter() - t) / n)
            return statistics.median(ts)
        for blas in (True, False):
            use(blas); run(); run()
        # same results either way?
        ratios, t = [], {True: [], False: []}
        for _ in range(11):
            order = [True, False]; random.shuffle(order); got = {}
            for blas in order:
                use(blas); got[blas] = timed(); t[blas].append(got[blas])
            ratios.append(got[False] / got[True])
        use(True)
        print(f"({T},{B},{I},{S}) {kind}: BLAS {statistics.median(t[True])*1e6:.1f} us, own {statistics.median(t[False])*1e6:.1f} us, "
              f"own / BLAS {statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f})", flush=True)
