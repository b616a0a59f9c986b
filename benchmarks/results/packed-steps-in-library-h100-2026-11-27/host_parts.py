"""Where a library step loop's host time goes: cublasGemmStridedBatchedEx called from Python
(ctypes) with a pack's varying row counts and with a constant one, the pointwise kernel's
ctypes call, and a no-op ctypes call; host time per call, no synchronisation inside."""
import ctypes, time, torch, pyroundlib
from pyroundlib import _cublas, _ffi
from pyroundlib.lltm import _forward_kernel
from pyroundlib._common import DTYPE_CODES
T, B, S, D = 200, 64, 768, 2
gen = torch.Generator().manual_seed(T * 1000 + B)
lengths = sorted(torch.randint(T // 2, T + 1, (B,), generator=gen).tolist(), reverse=True); lengths[0] = T
sizes = [sum(1 for n in lengths if n > t) for t in range(T)]
kw = dict(device="cuda", dtype=torch.bfloat16)
g = torch.zeros(B, D, 3 * S, **kw); h = torch.randn(B, D, S, **kw); w = torch.randn(D, 3 * S, S, **kw)
c, oh, oc = torch.randn(B, D, S, **kw), torch.empty(B, D, S, **kw), torch.empty(B, D, S, **kw)
gemm, handle, tf32 = _cublas.for_tensor(g)
I, L = ctypes.c_int, ctypes.c_longlong
fn = ctypes.CFUNCTYPE(I, ctypes.c_void_p, I, I, I, I, I, ctypes.c_void_p, ctypes.c_void_p, I, I, L, ctypes.c_void_p, I,
                      I, L, ctypes.c_void_p, ctypes.c_void_p, I, I, L, I, I, I)(gemm)
one = ctypes.c_float(1.0)
def product(n):
    return fn(handle, 1, 0, 3 * S, n, S, ctypes.byref(one), w.data_ptr(), 14, S, 3 * S * S, h.data_ptr(), 14, D * S, S,
              ctypes.byref(one), g.data_ptr(), 14, D * 3 * S, 3 * S, D, 68, -1)
lib = _ffi.library()
def timed(label, f, reps=3):
    for _ in range(2): f()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(reps):
        t0 = time.perf_counter(); f(); t1 = time.perf_counter(); torch.cuda.synchronize()
        best = min(best, t1 - t0)
    print(f"{label}: {1e6 * best / T:.2f} us a call (host)", flush=True)
timed("cublasGemmStridedBatchedEx, the pack's row counts", lambda: [product(n) for n in sizes])
timed("cublasGemmStridedBatchedEx, 64 rows each", lambda: [product(64) for n in sizes])
timed("cublasGemmStridedBatchedEx, 33 rows each", lambda: [product(33) for n in sizes])
timed("pointwise forward (ctypes, Kernel)", lambda: [_forward_kernel(g, g.data_ptr(), c.data_ptr(), oh.data_ptr(), oc.data_ptr(), D * n, S, DTYPE_CODES[g.dtype]) for n in sizes])
timed("no-op ctypes call (prl_abi_version)", lambda: [lib.prl_abi_version() for n in sizes])
timed("torch.baddbmm_ of the same product", lambda: [g[:n].transpose(0, 1).baddbmm_(h[:n].transpose(0, 1), w.transpose(1, 2)) for n in sizes])
