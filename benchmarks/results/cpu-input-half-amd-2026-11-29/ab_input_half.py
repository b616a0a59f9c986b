"""The input half on the CPU: the library's product (split among torch's threads) against
torch's GEMM (F.linear), interleaved rounds, medians; also checks they agree."""
import time, torch, torch.nn.functional as F
from pyroundlib import sequence, _threads
from pyroundlib.sequence import _input_half_kernel, DTYPE_CODES
def lib(x, w, b, S):
    rows = x.numel() // x.shape[-1]
    g = x.new_empty(*x.shape[:-1], 3 * S)
    _input_half_kernel(x, x.data_ptr(), w.data_ptr(), b.data_ptr(), g.data_ptr(), rows, x.shape[-1], S, DTYPE_CODES[x.dtype])
    return g
SIZES = [(100,64,256,256),(50,64,64,128),(30,16,256,256),(16,64,16,256),(100,32,64,128),(100,12,64,256),(30,4,256,256),(8,32,8,64),(64,8,128,64),(1000,64,256,256),(16,64,24,256),(16,64,32,256),(16,64,48,256),(16,64,64,256),(50,64,32,128),(50,64,16,128),(100,64,32,64)]
print(torch.__version__, torch.get_num_threads(), "threads; intel:", _threads._intel_cpu())
for (T,B,I,S) in SIZES:
    x = torch.randn(T,B,I); w = torch.randn(3*S, S+I)*0.1; b = torch.randn(3*S)
    with torch.inference_mode():
        ref = F.linear(x.double(), w[:, S:].double(), b.double())
        err = (lib(x,w,b,S).double()-ref).abs().max().item()
        fs = {"library": lambda: lib(x,w,b,S), "torch": lambda: F.linear(x, w[:, S:], b)}
        for f in fs.values(): f(); f()
        ts = {k: [] for k in fs}
        for r in range(15):
            for k in (list(fs) if r % 2 else list(fs)[::-1]):
                t = time.perf_counter(); fs[k](); ts[k].append(time.perf_counter() - t)
    med = {k: sorted(v)[len(v)//2]*1e6 for k, v in ts.items()}
    ratios = sorted(a/b for a, b in zip(ts["library"], ts["torch"]))
    print(f"(T,B,I,S)=({T},{B},{I},{S}) work {T*B*I*3*S/2**20:.1f}M: library {med['library']:.0f} us, torch {med['torch']:.0f} us, library/torch {ratios[len(ratios)//2]:.3f}; max err {err:.1e}")
