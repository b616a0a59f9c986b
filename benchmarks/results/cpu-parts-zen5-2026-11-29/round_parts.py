"""Where round_ste's CPU time goes at 2^16-2^20 elements: torch.round (allocating / out=), the op,
round_ste, the bare ctypes call into a preallocated output. Interleaved, medians of per-round medians."""
import statistics, sys, time, torch, pyroundlib
from pyroundlib import round as r
from pyroundlib._common import DTYPE_CODES
def per_call(f, n):
    t = time.perf_counter_ns()
    for _ in range(n): f()
    return (time.perf_counter_ns() - t) / n / 1000
def fresh(x, code):
    z = torch.empty_like(x)
    r._round_kernel(x, x.data_ptr(), z.data_ptr(), x.numel(), code)
    return z
for dtype in (torch.float32, torch.float64):
    for e in (16, 18, 20):
        x = torch.randn(1 << e, dtype=dtype) * 10
        y = torch.empty_like(x)
        code = DTYPE_CODES[dtype]
        cases = {"torch.round": lambda: torch.round(x), "torch.round out=": lambda: torch.round(x, out=y),
                 "round_ste": lambda: pyroundlib.round_ste(x),
                 "op round_ste_no_autograd": lambda: torch.ops.pyroundlib.round_ste_no_autograd(x),
                 "ctypes into y": lambda: r._round_kernel(x, x.data_ptr(), y.data_ptr(), x.numel(), code),
                 "empty_like + ctypes": lambda: fresh(x, code)}
        n = max(20, (1 << 22) >> e)
        res = {k: [] for k in cases}
        for rnd in range(9):
            for k, f in (list(cases.items()) if rnd % 2 else list(cases.items())[::-1]):
                f(); res[k].append(per_call(f, n))
        print(f"2^{e} {str(dtype)[6:]}: " + "; ".join(f"{k} {statistics.median(v):.1f}" for k, v in res.items()), flush=True)
