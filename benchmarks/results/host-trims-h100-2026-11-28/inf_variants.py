"""Which line of LLTMLayer._inference_stack costs host time on CUDA: copies of it with parts removed."""
import statistics, time, random
import torch
import pyroundlib
from pyroundlib import layer as L, sequence
from pyroundlib._common import autocast_cast

dev = torch.device("cuda")
T, B, I, S = 8, 32, 8, 64
ours = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, device=dev)
lstm = torch.nn.LSTM(I, S, num_layers=2, bidirectional=True, device=dev)
x = torch.randn(T, B, I, device=dev)
params = ours._direction_parameters()
W, Bs = [p[0] for p in params], [p[1] for p in params]
op = torch.ops.pyroundlib.lltm_layers_inference.default


def full():
    return ours._inference_stack(x, T, B, None)


def no_all_fused():
    weights, bias = zip(*ours._direction_parameters())
    xx, *weights = autocast_cast((x, *weights))
    bias = list(autocast_cast(bias))
    return op(xx, weights, bias, None, None, 2)


def no_params():
    if not L._all_fused(x, T, B, I, S, 2, 2):
        return None
    xx, *weights = autocast_cast((x, *W))
    bias = list(autocast_cast(Bs))
    return op(xx, weights, bias, None, None, 2)


def only_op():
    return op(x, W, Bs, None, None, 2)


def all_fused_then_op():
    L._all_fused(x, T, B, I, S, 2, 2)
    return op(x, W, Bs, None, None, 2)


def params_then_op():
    ours._direction_parameters()
    return op(x, W, Bs, None, None, 2)


def sync_free_sleep_then_op():  # 12 us of pure Python spin before the op
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 12e-6:
        pass
    return op(x, W, Bs, None, None, 2)


variants = {k: v for k, v in globals().items() if k in ("full", "no_all_fused", "no_params", "only_op",
                                                       "all_fused_then_op", "params_then_op",
                                                       "sync_free_sleep_then_op")}
variants["lstm"] = lambda: lstm(x)
variants["layer"] = lambda: ours(x)


def per_call(f, n=100):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


with torch.inference_mode():
    for f in variants.values():
        for _ in range(50):
            f()
    times = {k: [] for k in variants}
    rng = random.Random(0)
    for r in range(15):
        order = list(variants)
        rng.shuffle(order)
        for k in order:
            times[k].append(per_call(variants[k]))
for k, v in times.items():
    print(f"{k:26s} {statistics.median(v):8.1f} us  ({min(v):.1f}-{max(v):.1f})")
