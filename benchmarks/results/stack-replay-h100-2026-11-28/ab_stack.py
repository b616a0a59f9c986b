"""With / without the fused stack's graph replay (PYROUNDLIB_CUDA_GRAPHS=1 / 0), one process,
interleaved rounds in random order; nn.LSTM beside.  2-layer bidirectional, padded, fwd+bwd."""
import os, random, statistics, time, torch, pyroundlib
torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False
ROUNDS = 9
for (T, B, I, S) in ((8, 32, 8, 64), (32, 16, 32, 128)):
    for dtype in (torch.float32, torch.bfloat16):
        kw = dict(device="cuda", dtype=dtype)
        torch.manual_seed(0)
        ours = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, **kw)
        lstm = torch.nn.LSTM(I, S, num_layers=2, bidirectional=True, **kw)
        x = torch.randn(T, B, I, **kw, requires_grad=True)
        def make(m):
            params = [x, *m.parameters()]
            def run():
                o, (h, c) = m(x)
                return torch.autograd.grad(o.sum() + h.sum() + c.sum(), params)
            return run
        variants = {"replayed": ("1", make(ours)), "from Python": ("0", make(ours)), "nn.LSTM": ("1", make(lstm))}
        times = {k: [] for k in variants}
        walls = {k: [] for k in variants}
        for r in range(ROUNDS):
            order = list(variants); random.shuffle(order)
            for k in order:
                env, f = variants[k]
                os.environ["PYROUNDLIB_CUDA_GRAPHS"] = env
                for _ in range(10): f()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(20): f()
                torch.cuda.synchronize()
                times[k].append((time.perf_counter() - t0) / 20 * 1e6)
                ws = []
                for _ in range(10):  # one call, synchronised: host time plus the GPU's tail
                    torch.cuda.synchronize(); t0 = time.perf_counter(); f(); torch.cuda.synchronize()
                    ws.append((time.perf_counter() - t0) * 1e6)
                walls[k].append(statistics.median(ws))
        line = f"({T},{B},{I},{S}) {str(dtype)[6:]} fwd+bwd:"
        for k in variants:
            line += f" {k} {statistics.median(times[k]):.0f} us (one call {statistics.median(walls[k]):.0f})"
        rr = [a / b for a, b in zip(times["replayed"], times["from Python"])]
        rl = [a / b for a, b in zip(times["replayed"], times["nn.LSTM"])]
        pl = [a / b for a, b in zip(times["from Python"], times["nn.LSTM"])]
        print(line + f"; replayed / from Python {statistics.median(rr):.3f} ({min(rr):.3f}-{max(rr):.3f}),"
              f" replayed / nn.LSTM {statistics.median(rl):.3f}, from Python / nn.LSTM {statistics.median(pl):.3f}",
              flush=True)
os.environ["PYROUNDLIB_CUDA_GRAPHS"] = "1"
