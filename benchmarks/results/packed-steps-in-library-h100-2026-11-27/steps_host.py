"""Host and GPU time of the library's pack step loop alone (prl_lltm_packed_steps_forward_cuda):
(200,64,*,768) and (100,256,*,1024) bfloat16, two directions; host time of the call (no sync)
against its wall time, then the GPU kernels by torch.profiler."""
import ctypes, time, torch
from pyroundlib import _cublas, _packed
from pyroundlib._common import DTYPE_CODES
for T, B, S in ((200, 64, 768), (100, 256, 1024)):
    D, dtype = 2, torch.bfloat16
    gen = torch.Generator().manual_seed(T * 1000 + B)
    lengths = sorted(torch.randint(T // 2, T + 1, (B,), generator=gen).tolist(), reverse=True); lengths[0] = T
    sizes = [sum(1 for n in lengths if n > t) for t in range(T)]
    N = sum(sizes)
    kw = dict(device="cuda", dtype=dtype)
    gates0 = torch.randn(N, D, 3 * S, **kw); gates = gates0.clone()
    w_h = torch.randn(D, 3 * S, S, **kw) * S ** -0.5
    h0, c0 = torch.randn(B, D, S, **kw), torch.randn(B, D, S, **kw)
    out, cells = torch.empty(N, D, S, **kw), torch.empty(N, D, S, **kw)
    arr = (ctypes.c_int64 * T)(*sizes)
    cub = _cublas.for_tensor(gates)
    def call():
        _packed._steps_forward_kernel(gates, *cub, gates.data_ptr(), w_h.data_ptr(), S, 3 * S * S, h0.data_ptr(),
                                      c0.data_ptr(), out.data_ptr(), cells.data_ptr(), arr, T, B, S, D,
                                      DTYPE_CODES[dtype])
    for _ in range(3): call()
    torch.cuda.synchronize()
    n = 10
    t0 = time.perf_counter()
    for _ in range(n): call()
    t1 = time.perf_counter(); torch.cuda.synchronize(); t2 = time.perf_counter()
    print(f"(T,B,S)=({T},{B},{S}) bf16 D=2: host {1e6 * (t1 - t0) / n / T:.2f} us a step, wall {1e6 * (t2 - t0) / n / T:.2f} us a step", flush=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        call(); torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=6), flush=True)
