"""A/B in one process: the persistent route's float32 input half by torch's GEMM from
INPUT_HALF_BY_TORCH_FROM_FLOAT32 on (new) or always the library's own product (old);
interleaved rounds in random order, CUDA events around 5 calls, median per call.
Run: python3 ab_half.py (GPU machine, pyroundlib importable).  ab-every-float.txt came from
the same script with the rule "every float32 and float64 size by torch" as new."""
import math, random, statistics, sys, torch, pyroundlib
from pyroundlib import sequence
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
NEW = 1 << 28
OLD = float('inf')
dev = "cuda"
def seq_case(T, B, I, S, dtype, train):
    x = torch.randn(T, B, I, device=dev, dtype=dtype, requires_grad=train)
    w = (torch.randn(3 * S, S + I, device=dev, dtype=dtype) / math.sqrt(S)).requires_grad_(train)
    b = (torch.randn(3 * S, device=dev, dtype=dtype) * 0.1).requires_grad_(train)
    h0, c0 = torch.randn(B, S, device=dev, dtype=dtype), torch.randn(B, S, device=dev, dtype=dtype)
    if train:
        g = torch.randn(T, B, S, device=dev, dtype=dtype)
        return lambda: torch.autograd.grad(pyroundlib.lltm_sequence(x, w, b, (h0, c0))[0], [x, w, b], g)
    def run():
        with torch.inference_mode():
            return pyroundlib.lltm_sequence(x, w, b, (h0, c0))
    return run
def layer_case(T, B, I, S, dtype, train):
    layer = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, device=dev, dtype=dtype)
    x = torch.randn(T, B, I, device=dev, dtype=dtype, requires_grad=True)
    if train:
        params = [x, *layer.parameters()]
        def run():
            out, (h, c) = layer(x)
            return torch.autograd.grad(out.sum() + h.sum() + c.sum(), params)
        return run
    def run():
        with torch.inference_mode():
            return layer(x)
    return run
def timed(fn, n):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n): fn()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / n * 1e3
cases = []
for shape in [(50, 64, 256, 512), (1000, 64, 256, 256), (1000, 16, 64, 64), (300, 64, 128, 128), (200, 32, 128, 256),
              (100, 16, 256, 256), (1000, 1, 128, 128), (500, 4, 256, 256), (200, 8, 64, 512), (100, 64, 64, 512),
              (50, 1, 64, 64)]:
    for train in (True, False):
        cases.append((f"lltm_sequence {shape} float32 {'fwd+bwd' if train else 'inference'}", seq_case(*shape, torch.float32, train)))
for train in (True, False):
    cases.append((f"LLTMLayer 2x2 (50,64,256,512) float32 {'fwd+bwd' if train else 'inference'}", layer_case(50, 64, 256, 512, torch.float32, train)))
    cases.append((f"lltm_sequence (300,16,32,32) float64 {'fwd+bwd' if train else 'inference'}", seq_case(300, 16, 32, 32, torch.float64, train)))
rounds = 7
res = {name: {"new": [], "old": []} for name, _ in cases}
for name, fn in cases:  # warm both
    for v in (NEW, OLD):
        sequence.INPUT_HALF_BY_TORCH_FROM_FLOAT32 = v
        fn(); fn()
torch.cuda.synchronize()
for r in range(rounds):
    order = list(cases); random.shuffle(order)
    for name, fn in order:
        vs = [("new", NEW), ("old", OLD)]; random.shuffle(vs)
        for tag, v in vs:
            sequence.INPUT_HALF_BY_TORCH_FROM_FLOAT32 = v
            fn(); torch.cuda.synchronize()
            res[name][tag].append(timed(fn, 5))
for name, _ in cases:
    n, o = statistics.median(res[name]["new"]), statistics.median(res[name]["old"])
    ratios = [a / b for a, b in zip(res[name]["new"], res[name]["old"])]
    print(f"{name}: new {n:9.1f} us  old {o:9.1f} us  new/old {n/o:.3f}  (per round {min(ratios):.2f}-{max(ratios):.2f})", flush=True)
