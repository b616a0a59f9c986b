"""Host time of cublasLtMatmul with a plan made once (ctypes) against cublasGemmStridedBatchedEx,
the (200,64,*,768) bfloat16 lockstep step's product (n = 64 rows, 2 directions)."""
import ctypes, os, re, time, torch
from ctypes import byref, c_int, c_int32, c_int64, c_uint64, c_void_p, c_float, c_size_t
from pyroundlib import _cublas, _threads
S, D, n = 768, 2, 64
kw = dict(device="cuda", dtype=torch.bfloat16)
g1 = torch.zeros(n, D, 3 * S, **kw); g2 = torch.zeros(n, D, 3 * S, **kw)
h = torch.randn(n, D, S, **kw); w = torch.randn(D, 3 * S, S, **kw) * 0.03
gemm, handle, _ = _cublas.for_tensor(g1)
path = [p for p in _threads.loaded_libraries(re.compile(r"libcublasLt\.so(\.\d+)*$"))][0]
print(path, flush=True)
lt = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
def ok(status, what):
    assert status == 0, f"{what}: {status}"
lth = c_void_p(); ok(lt.cublasLtCreate(byref(lth)), "create")
desc = c_void_p(); ok(lt.cublasLtMatmulDescCreate(byref(desc), c_int(68), c_int(0)), "desc")
for attr, v in ((3, 1), (4, 0)):
    x = c_int32(v); ok(lt.cublasLtMatmulDescSetAttribute(desc, c_int(attr), byref(x), c_size_t(4)), "descattr")
def layout(rows, cols, ld, stride):
    l = c_void_p(); ok(lt.cublasLtMatrixLayoutCreate(byref(l), c_int(14), c_uint64(rows), c_uint64(cols), c_int64(ld)), "layout")
    b = c_int32(D); ok(lt.cublasLtMatrixLayoutSetAttribute(l, c_int(5), byref(b), c_size_t(4)), "batch")
    s = c_int64(stride); ok(lt.cublasLtMatrixLayoutSetAttribute(l, c_int(6), byref(s), c_size_t(8)), "stride")
    return l
A, B, C = layout(S, 3 * S, S, 3 * S * S), layout(S, n, D * S, S), layout(3 * S, n, D * 3 * S, 3 * S)
pref = c_void_p(); ok(lt.cublasLtMatmulPreferenceCreate(byref(pref)), "pref")
zero = c_uint64(0); ok(lt.cublasLtMatmulPreferenceSetAttribute(pref, c_int(1), byref(zero), c_size_t(8)), "prefattr")
class Result(ctypes.Structure):
    _fields_ = [("algo", c_uint64 * 8), ("workspace", c_size_t), ("state", c_int), ("waves", c_float), ("reserved", c_int * 4)]
results, returned = (Result * 1)(), c_int(0)
t0 = time.perf_counter()
ok(lt.cublasLtMatmulAlgoGetHeuristic(lth, desc, A, B, C, C, pref, c_int(1), results, byref(returned)), "heuristic")
print(f"heuristic {1e6 * (time.perf_counter() - t0):.1f} us, returned {returned.value}, state {results[0].state}", flush=True)
one = c_float(1.0)
stream = c_void_p(torch.cuda.current_stream().cuda_stream)
algo = ctypes.pointer(results[0].algo)
mm = lt.cublasLtMatmul
mm.argtypes = [c_void_p] * 16; mm.restype = c_int
def lt_call():
    return mm(lth, desc, ctypes.addressof(one), w.data_ptr(), A, h.data_ptr(), B, ctypes.addressof(one), g2.data_ptr(), C,
              g2.data_ptr(), C, ctypes.addressof(results[0].algo), None, 0, stream)
I, L = ctypes.c_int, ctypes.c_longlong
fn = ctypes.CFUNCTYPE(I, c_void_p, I, I, I, I, I, c_void_p, c_void_p, I, I, L, c_void_p, I, I, L, c_void_p, c_void_p, I, I, L, I, I, I)(gemm)
def gemm_call():
    return fn(handle, 1, 0, 3 * S, n, S, ctypes.addressof(one), w.data_ptr(), 14, S, 3 * S * S, h.data_ptr(), 14, D * S, S,
              ctypes.addressof(one), g1.data_ptr(), 14, D * 3 * S, 3 * S, D, 68, -1)
ok(lt_call(), "matmul"); ok(gemm_call(), "gemm"); torch.cuda.synchronize()
print("results equal:", torch.equal(g1, g2), (g1.float() - g2.float()).abs().max().item(), flush=True)
for name, f in (("cublasGemmStridedBatchedEx", gemm_call), ("cublasLtMatmul, plan made once", lt_call)) * 2:
    for _ in range(20): f()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(200): f()
        best = min(best, time.perf_counter() - t0); torch.cuda.synchronize()
    print(f"{name}: {1e6 * best / 200:.2f} us a call (host, ctypes)", flush=True)
