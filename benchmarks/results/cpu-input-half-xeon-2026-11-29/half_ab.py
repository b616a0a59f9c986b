"""The input half on torch's threads: torch's F.linear (MKL on Intel) against the library's
product (prl_lltm_input_half_cpu through pyroundlib's kernel wrapper), interleaved, medians."""
import os, sys, time, statistics, random, torch, pyroundlib
from pyroundlib import sequence as sq
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 15
print("threads", torch.get_num_threads(), "library", os.environ.get("PYROUNDLIB_LIBRARY"), flush=True)
def lib_half(x, w, b, S):
    rows, features = x.shape[0] * x.shape[1], x.shape[2]
    g = x.new_empty(*x.shape[:-1], 3 * S)
    sq._input_half_kernel(x, x.data_ptr(), w.data_ptr(), b.data_ptr(), g.data_ptr(), rows, features, S, sq.DTYPE_CODES[x.dtype])
    return g
def med(f, n):
    ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return statistics.median(ts)
for T, B, I, S in [(30,16,256,256), (100,12,64,256), (16,64,16,256), (50,64,64,128), (100,64,256,256), (30,4,256,256), (8,32,8,64), (100,32,64,128)]:
    x = torch.randn(T, B, I); w = torch.randn(3*S, S+I); b = torch.randn(3*S)
    ref = torch.nn.functional.linear(x.double(), w[:, S:].double(), b.double())
    fs = {"F.linear": lambda: torch.nn.functional.linear(x, w[:, S:], b), "library": lambda: lib_half(x, w, b, S)}
    for f in fs.values():
        for _ in range(5): f()
    res = {k: [] for k in fs}
    for r in range(rounds):
        ks = list(fs); random.shuffle(ks)
        for k in ks: res[k].append(med(fs[k], 20))
    m = {k: statistics.median(v) * 1e6 for k, v in res.items()}
    err = (lib_half(x, w, b, S).double() - ref).abs().max().item()
    print(f"({T},{B},{I},{S}) F.linear {m['F.linear']:8.1f} us | library {m['library']:8.1f} us | library/F.linear {m['library']/m['F.linear']:.3f} | max err {err:.1e}", flush=True)
