"""Host time per call of the pieces of a 2-layer bidirectional LLTMLayer at (8,32,8,64) on CUDA."""
import statistics, sys, time
import torch
import pyroundlib
from pyroundlib import layer as L, graphs, sequence

dtype = getattr(torch, sys.argv[1]) if len(sys.argv) > 1 else torch.float32
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = torch.device("cuda")
T, B, I, S = 8, 32, 8, 64
ours = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, device=dev, dtype=dtype)
lstm = torch.nn.LSTM(I, S, num_layers=2, bidirectional=True, device=dev, dtype=dtype)
x = torch.randn(T, B, I, device=dev, dtype=dtype, requires_grad=True)
params = [t for pair in ours._direction_parameters() for t in pair]
h0 = torch.zeros(4, B, S, device=dev, dtype=dtype)
c0 = torch.zeros(4, B, S, device=dev, dtype=dtype)
xd = x.detach()
layout = L._Padded(2, False)
ws, bs = [p for p in params[::2]], [p for p in params[1::2]]
gsum = None


def train(layer):
    ps = [x, *layer.parameters()]
    def run():
        o, (h, c) = layer(x)
        return torch.autograd.grad(o.sum() + h.sum() + c.sum(), ps)
    return run


def train_apply():
    o, h, c, *_ = L.LLTMStackFunction.apply(x, h0, c0, layout, *params)
    return torch.autograd.grad(o.sum() + h.sum() + c.sum(), [x, *params])


def fwd_only():
    return ours(x)


def apply_only():
    return L.LLTMStackFunction.apply(x, h0, c0, layout, *params)


def replayed_forward():
    return L._replayed_forward(xd, h0, c0, params)


saved_fwd = L._replayed_forward(xd, h0, c0, params)
go = torch.ones(T, B, 2 * S, device=dev, dtype=dtype)
gh = torch.ones(4, B, S, device=dev, dtype=dtype)


def replayed_backward():
    return L._replayed_backward(go, gh, gh, xd, h0, c0, params, list(saved_fwd[3:]))


def loss_only():
    o = torch.randn(T, B, 2 * S, device=dev, dtype=dtype, requires_grad=True)
    return torch.autograd.grad(o.sum() + o.sum() + o.sum(), [o])


def infer(layer):
    def run():
        with torch.inference_mode():
            return layer(x)
    return run


def infer_op():
    with torch.inference_mode():
        return torch.ops.pyroundlib.lltm_layers_inference.default(xd, ws, bs, None, None, 2)


def infer_impl():
    with torch.inference_mode():
        return L._stack_inference(xd, ws, bs, None, None, 2)


def empties():
    return [xd.new_empty(T, B, S) for _ in range(16)]


def empties_pool():
    with graphs.buffers(xd):
        return [xd.new_empty(T, B, S) for _ in range(16)]


def per_call(f, n=50):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


variants = {"layer fwd+bwd": train(ours), "lstm fwd+bwd": train(lstm), "apply fwd+bwd": train_apply,
            "layer fwd (grad on)": fwd_only, "apply fwd": apply_only, "_replayed_forward": replayed_forward,
            "_replayed_backward": replayed_backward, "loss+grad of a leaf": loss_only,
            "layer inference": infer(ours), "lstm inference": infer(lstm), "op inference": infer_op,
            "impl inference": infer_impl, "16 new_empty": empties, "16 new_empty in pool": empties_pool}
for f in variants.values():
    for _ in range(30):
        f()
times = {k: [] for k in variants}
for r in range(9):
    for k, f in variants.items():
        times[k].append(per_call(f))
for k, v in times.items():
    print(f"{k:26s} {statistics.median(v):8.1f} us  ({min(v):.1f}-{max(v):.1f})")
print("graphs held:", len(graphs._graphs))

from torch.profiler import profile, ProfilerActivity
for name in ("layer fwd+bwd", "lstm fwd+bwd", "layer inference", "lstm inference"):
    f = variants[name]
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            f()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.device_time for e in kernels) / 10
    print(f"{name}: {len(kernels) / 10:.0f} GPU events a call, {busy:.1f} us of GPU time a call")
