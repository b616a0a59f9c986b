"""Memory of a 2-layer bidirectional LLTMLayer, float32 (TF32 off) and bfloat16, with graph replay on and off:
the peak above the baseline during the 4th of four fwd+bwd calls, and what stays reserved once
the results are dropped.  python3 memory.py"""
import gc, os
import torch, pyroundlib
from pyroundlib import graphs

torch.backends.cuda.matmul.allow_tf32 = False


def memory_of(fn, calls=4):
    graphs.clear(); gc.collect(); torch.cuda.synchronize(); torch.cuda.empty_cache()
    base_alloc, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    for _ in range(calls):
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base_alloc
        del out
    gc.collect(); torch.cuda.empty_cache()
    held = torch.cuda.memory_reserved() - base_reserved
    graphs.clear(); gc.collect(); torch.cuda.empty_cache()
    return peak / 2**20, held / 2**20


for (T, B, I, S), dtype in [(size, dtype) for dtype in (torch.float32, torch.bfloat16)
                            for size in ((200, 64, 128, 768), (100, 64, 256, 1024))]:
    torch.manual_seed(0)
    layer = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, device="cuda", dtype=dtype)
    x = torch.randn(T, B, I, device="cuda", dtype=dtype, requires_grad=True)

    def train():
        o, (h, c) = layer(x)
        return torch.autograd.grad(o.sum() + h.sum() + c.sum(), [x, *layer.parameters()])

    def infer():
        with torch.inference_mode():
            return layer(x)

    for name, fn in (("fwd+bwd", train), ("inference", infer)):
        row = []
        for on in ("1", "0"):
            os.environ[graphs.ENV_VAR] = on
            row.append(memory_of(fn))
        (p1, h1), (p0, h0) = row
        print(f"({T},{B},{I},{S}) {str(dtype)[6:]} {name}: graphs on: peak {p1:.0f} MB, held {h1:.0f} MB | "
              f"off: peak {p0:.0f} MB, held {h0:.0f} MB", flush=True)
