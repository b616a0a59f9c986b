"""Host time of a small 2-layer bidirectional LLTMLayer fwd+bwd on CUDA: cProfile of the calls, and parts."""
import cProfile, pstats, statistics, time, io, sys, torch, pyroundlib
torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False
T, B, I, S = 8, 32, 8, 64
def wall(f, n=50, reps=7):
    for _ in range(20): f()
    torch.cuda.synchronize(); ws = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n): f()
        torch.cuda.synchronize(); ws.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(ws)
for dtype in (torch.float32, torch.bfloat16):
    kw = dict(device="cuda", dtype=dtype)
    torch.manual_seed(0)
    layer = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, **kw)
    ref = torch.nn.LSTM(I, S, num_layers=2, bidirectional=True, **kw)
    x = torch.randn(T, B, I, **kw, requires_grad=True)
    for name, m in (("ours", layer), ("nn.LSTM", ref)):
        params = [x, *m.parameters()]
        def train():
            o, (h, c) = m(x)
            return torch.autograd.grad(o.sum() + h.sum() + c.sum(), params)
        def fwd():
            o, (h, c) = m(x)
            return o.sum() + h.sum() + c.sum()
        def infer():
            with torch.inference_mode():
                return m(x)
        def loss_only():
            return torch.autograd.grad((x * 2).sum(), [x])
        print(f"{name} {dtype}: fwd+bwd {wall(train):.0f} us, forward (grad on, no backward) {wall(fwd):.0f} us, "
              f"inference {wall(infer):.0f} us, a trivial autograd.grad {wall(loss_only):.0f} us", flush=True)
    params = [x, *layer.parameters()]
    def train():
        o, (h, c) = layer(x)
        return torch.autograd.grad(o.sum() + h.sum() + c.sum(), params)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(300): train()
    torch.cuda.synchronize()
    pr.disable()
    for key in ("tottime", "cumulative"):
        s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats(key).print_stats(35); print(s.getvalue()[-9000:])
