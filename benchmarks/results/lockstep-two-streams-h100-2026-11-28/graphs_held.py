"""Which graphs a 2-layer bidirectional LLTMLayer holds after each of six fwd+bwd calls, and the
memory reserved (graphs.txt).  python3 graphs_held.py"""
import gc, torch, pyroundlib
from pyroundlib import graphs
torch.backends.cuda.matmul.allow_tf32 = False
for dtype in (torch.float32, torch.bfloat16):
  for T, B, I, S in [(200, 64, 128, 768), (100, 64, 256, 1024)]:
    graphs.clear(); gc.collect(); torch.cuda.empty_cache()
    torch.manual_seed(0)
    layer = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, device="cuda", dtype=dtype)
    x = torch.randn(T, B, I, device="cuda", dtype=dtype, requires_grad=True)
    base = torch.cuda.memory_reserved()
    for i in range(6):
        o, (h, c) = layer(x)
        g = torch.autograd.grad(o.sum() + h.sum() + c.sum(), [x, *layer.parameters()])
        del o, h, c, g
        torch.cuda.synchronize()
        kinds = [("copies" if isinstance(v, graphs._OverCopies) else "own") + ":" + k[0].__name__ for k, v in graphs._graphs.items()]
        print(dtype, (T, B, I, S), i, "reserved+", (torch.cuda.memory_reserved() - base) >> 20, "MB", "seen", len(graphs._seen), kinds, flush=True)
