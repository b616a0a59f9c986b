"""A/B in one process: PYROUNDLIB_AB unset (the kernels as on main), 'f' (the lean S = 64 forward rows kernel),
'fb' (and the backward's sizes carried); settings interleaved per round in random order; nn.LSTM beside."""
import os, random, statistics, sys
import torch
import pyroundlib
from pyroundlib import sequence

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 7
CALLS = 5
SHAPES = [(1000, 16, 64, 64), (500, 64, 64, 64), (200, 1, 64, 64), (1000, 1, 64, 64), (1000, 64, 64, 64),
          (300, 4, 256, 64), (1000, 1, 128, 128), (300, 64, 128, 128), (200, 32, 128, 256), (1000, 64, 256, 256),
          (500, 4, 256, 256)]
ENV = "PYROUNDLIB_AB"


def setv(v):
    if v:
        os.environ[ENV] = v
    else:
        os.environ.pop(ENV, None)


def args_for(T, B, I, S, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
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


def bits_check():
    """Every variant gives the bits of the kernels as on main: padded and over packs, outputs and gradients."""
    ok = True
    for (T, B, I, S) in [(300, 16, 8, 64), (50, 5, 8, 64), (40, 9, 16, 128), (30, 6, 8, 256), (20, 3, 8, 64)]:
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            a = args_for(T, B, I, S, dtype, seed=T + B)
            lengths = sorted([random.randint(1, T) for _ in range(B)], reverse=True)
            lengths[0] = T
            random.shuffle(lengths)
            res = {}
            for v in ["", "r", "s", "c", "b"]:
                setv(v)
                out, (h, c) = pyroundlib.lltm_sequence(a[0], a[1], a[2], (a[3], a[4]))
                grads = torch.autograd.grad((out * 1.5).sum() + c.sum(), a)
                with torch.inference_mode():
                    io, (ih, ic) = pyroundlib.lltm_sequence(a[0], a[1], a[2], (a[3], a[4]))
                layer = pyroundlib.LLTMLayer(I, S, device="cuda", dtype=dtype)
                torch.manual_seed(1)
                with torch.no_grad():
                    for prm in layer.parameters():
                        prm.copy_(torch.randn_like(prm) * 0.125)
                pack = torch.nn.utils.rnn.pack_padded_sequence(a[0].detach(), lengths, enforce_sorted=False)
                po, (ph, pc) = layer(pack)
                pg = torch.autograd.grad(po.data.sum() * 1.5 + pc.sum() + ph.sum(), list(layer.parameters()))
                res[v] = [out, h, c, *grads, io, ih, ic, po.data, ph, pc, *pg]
            for v in ["r", "s", "c", "b"]:
                same = all(torch.equal(x, y) for x, y in zip(res[""], res[v]))
                ok &= same
                if not same:
                    print(f"bits {(T, B, I, S)} {dtype} '{v}' differs", flush=True)
    setv("")
    print(f"bits: every variant the same as main: {ok}", flush=True)


print(torch.cuda.get_device_name(), torch.__version__, flush=True)
bits_check()
print("| (T,B,I,S) | dtype | mode | main us | r us | s us | c us | b us | nn.LSTM us | r/main | s/main | c/main | b/main | best / nn.LSTM | main / nn.LSTM | route |")
print("|---|---|---|" + "---:|" * 12 + "---|")
only = sys.argv[2] if len(sys.argv) > 2 else ""
for shape in SHAPES:
    for dtype in (torch.float32, torch.bfloat16):
        if only and only not in f"{shape}":
            continue
        a = args_for(*shape, dtype)
        mx = lstm_for(*shape, dtype)
        for mode in ("inference", "fwd+bwd"):
            if shape[3] != 64 and mode == "inference":
                continue  # the forward changed only at S = 64
            variants = ["", "r", "s", "c"] if mode == "inference" else ["", "b"]
            route = sequence._route(a[0], *shape, inference=mode == "inference")
            times = {k: [] for k in variants + ["lstm"]}
            for v in variants:
                setv(v)
                timed(lambda: ours(a, mode))
            timed(lambda: theirs(mx, mode))
            for _ in range(ROUNDS):
                order = variants + ["lstm"]
                random.shuffle(order)
                for k in order:
                    if k == "lstm":
                        times[k].append(timed(lambda: theirs(mx, mode)))
                    else:
                        setv(k)
                        times[k].append(timed(lambda: ours(a, mode)))
            med = {k: statistics.median(v) for k, v in times.items()}
            rel = {v: statistics.median([n / o for n, o in zip(times[v], times[""])]) for v in variants[1:]}
            best = min(variants, key=lambda v: med[v])
            vs = statistics.median([n / l for n, l in zip(times[best], times["lstm"])])
            vm = statistics.median([n / l for n, l in zip(times[""], times["lstm"])])
            cell = lambda k, d: (f"{d[k]:.1f}" if k in d else "-")
            cellr = lambda k: (f"{rel[k]:.3f}" if k in rel else "-")
            print(f"| {shape} | {str(dtype)[6:]} | {mode} | " + " | ".join(cell(k, med) for k in ["", "r", "s", "c", "b"]) + f" | {med['lstm']:.1f} | "
                  + " | ".join(cellr(k) for k in ["r", "s", "c", "b"]) + f" | '{best}' {vs:.3f} | {vm:.3f} | {route} |", flush=True)
setv("")
