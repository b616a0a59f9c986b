"""A/B: the forward's kernel of a thread a gate row (PYROUNDLIB_ROWS_KERNEL=1) against the S=64
kernel (=0), one process, settings interleaved per round in random order; nn.LSTM beside."""
import os, random, statistics, sys
import torch
import pyroundlib
from pyroundlib import sequence

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 7
CALLS = 5
SHAPES = [(1000, 16, 64, 64), (500, 64, 64, 64), (300, 4, 256, 64), (200, 1, 64, 64), (1000, 1, 64, 64),
          (1000, 64, 64, 64), (200, 256, 64, 64)]
VARIANTS = ["0", "1"]
ENV = "PYROUNDLIB_BWD_ROWS"


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
    (out.sum() + c.sum()).backward()


def lstm_for(T, B, I, S, dtype):
    m = torch.nn.LSTM(I, S).to(device="cuda", dtype=dtype)
    x = torch.randn(T, B, I, device="cuda", dtype=dtype, requires_grad=True)
    return m, x


def theirs(mx, mode):
    m, x = mx
    if mode == "inference":
        with torch.inference_mode():
            return m(x)
    out, (h, c) = m(x)
    (out.sum() + c.sum()).backward()


def timed(fn):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(CALLS):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / CALLS  # us a call


print(torch.cuda.get_device_name(), torch.__version__, flush=True)
def bits_check():
    """v2 and v3 give v1's bits: padded and over a pack, forward and gradients."""
    for dtype in (torch.float32, torch.bfloat16):
        a = args_for(300, 16, 8, 64, dtype)
        lengths = [300, 290, 250, 200, 200, 90, 40, 1] * 2
        res = {}
        for v in VARIANTS:
            os.environ[ENV] = v
            out, (h, c) = pyroundlib.lltm_sequence(a[0], a[1], a[2], (a[3], a[4]))
            grads = torch.autograd.grad((out * 1.5).sum() + c.sum(), a)
            layer = pyroundlib.LLTMLayer(8, 64, device="cuda", dtype=dtype)
            torch.manual_seed(1)
            with torch.no_grad():
                for prm in layer.parameters():
                    prm.copy_(torch.randn_like(prm) * 0.125)
            pack = torch.nn.utils.rnn.pack_padded_sequence(a[0].detach(), lengths, enforce_sorted=False)
            po, (ph, pc) = layer(pack)
            res[v] = [out, h, c, *grads, po.data, ph, pc]
        for v in VARIANTS[1:]:
            same = all(torch.equal(x, y) for x, y in zip(res["0"], res[v]))
            print(f"bits {dtype} v{v} == v1: {same}", flush=True)


bits_check()
print("| (T,B,I,S) | dtype | mode | " + " | ".join(f"v{v} us" for v in VARIANTS) + " | nn.LSTM us | " + " | ".join(f"v{v}/v0" for v in VARIANTS[1:]) + " | best / nn.LSTM | route |")
print("|---|---|---|" + "---:|" * (2 * len(VARIANTS) + 1) + "---|")
for shape in SHAPES:
    for dtype in (torch.float32, torch.bfloat16):
        a = args_for(*shape, dtype)
        mx = lstm_for(*shape, dtype)
        for mode in ("inference", "fwd+bwd"):
            route = sequence._route(a[0], *shape, inference=mode == "inference")
            times = {k: [] for k in VARIANTS + ["lstm"]}
            for v in VARIANTS:
                os.environ[ENV] = v
                timed(lambda: ours(a, mode))
            timed(lambda: theirs(mx, mode))
            for _ in range(ROUNDS):
                order = VARIANTS + ["lstm"]
                random.shuffle(order)
                for k in order:
                    if k == "lstm":
                        times[k].append(timed(lambda: theirs(mx, mode)))
                    else:
                        os.environ[ENV] = k
                        times[k].append(timed(lambda: ours(a, mode)))
            med = {k: statistics.median(v) for k, v in times.items()}
            rel = [statistics.median([n / o for n, o in zip(times[v], times["0"])]) for v in VARIANTS[1:]]
            best = min(VARIANTS, key=lambda v: med[v])
            vs = statistics.median([n / l for n, l in zip(times[best], times["lstm"])])
            print(f"| {shape} | {str(dtype)[6:]} | {mode} | " + " | ".join(f"{med[v]:.1f}" for v in VARIANTS)
                  + f" | {med['lstm']:.1f} | " + " | ".join(f"{r:.3f}" for r in rel) + f" | v{best} {vs:.3f} | {route} |", flush=True)
os.environ.pop(ENV)
