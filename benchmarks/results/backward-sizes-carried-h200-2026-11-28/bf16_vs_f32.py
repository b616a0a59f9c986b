"""bfloat16 against float32 at the host-bound (50,1,64,64), and (1000,16,64,64) float32 against nn.LSTM:
one process, settings interleaved per round in random order, CUDA events around CALLS calls, medians of
per-round ratios."""
import random, statistics, sys
import torch
import pyroundlib

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 31


def args_for(T, B, I, S, dtype):
    g = torch.Generator().manual_seed(0)
    shapes = [(T, B, I), (3 * S, S + I), (3 * S,), (B, S), (B, S)]
    scales = [1.0, S ** -0.5, 1.0, 1.0, 1.0]
    return [(torch.randn(s, generator=g, dtype=torch.float64) * k).to(dtype=dtype, device="cuda").requires_grad_()
            for s, k in zip(shapes, scales)]


def ours(a, mode):
    if mode == "inference":
        with torch.inference_mode():
            return pyroundlib.lltm_sequence(a[0], a[1], a[2], (a[3], a[4]))
    out, (h, c) = pyroundlib.lltm_sequence(a[0], a[1], a[2], (a[3], a[4]))
    out.sum().backward()


def timed(fn, calls):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / calls


def compare(name, fns, calls):
    for f in fns.values():
        timed(f, calls)
    times = {k: [] for k in fns}
    for _ in range(ROUNDS):
        order = list(fns)
        random.shuffle(order)
        for k in order:
            times[k].append(timed(fns[k], calls))
    keys = list(fns)
    ratio = statistics.median([x / y for x, y in zip(times[keys[0]], times[keys[1]])])
    print(f"| {name} | " + " | ".join(f"{k} {statistics.median(times[k]):.1f} us" for k in keys)
          + f" | {keys[0]} / {keys[1]} {ratio:.3f} |", flush=True)


print(torch.cuda.get_device_name(), torch.__version__, ROUNDS, "rounds", flush=True)
shape = (50, 1, 64, 64)
a16, a32 = args_for(*shape, torch.bfloat16), args_for(*shape, torch.float32)
for mode in ("inference", "fwd+bwd"):
    compare(f"{shape} {mode}", {"bfloat16": lambda: ours(a16, mode), "float32": lambda: ours(a32, mode)}, 20)
shape = (1000, 16, 64, 64)
a = args_for(*shape, torch.float32)
m = torch.nn.LSTM(64, 64).cuda()
x = torch.randn(1000, 16, 64, device="cuda")


def lstm():
    with torch.inference_mode():
        m(x)


compare(f"{shape} float32 inference", {"pyroundlib": lambda: ours(a, "inference"), "nn.LSTM": lstm}, 5)
