"""(1000,16,64,64) float32 inference, TF32 off: the default route, =fused, =1, against nn.LSTM; interleaved."""
import os, statistics, torch, pyroundlib
torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False
for T, B, I, S in ((1000, 16, 64, 64), (1000, 1, 128, 128), (300, 64, 128, 128)):
    kw = dict(device="cuda", dtype=torch.float32)
    torch.manual_seed(0)
    cell = pyroundlib.LLTM(I, S, **kw)
    lstm = torch.nn.LSTM(I, S, **kw)
    x = torch.randn(T, B, I, **kw)
    h0 = torch.zeros(B, S, **kw); c0 = torch.zeros(B, S, **kw)
    def ours(env):
        def run():
            os.environ[pyroundlib.sequence.PERSISTENT_ENV_VAR] = env
            with torch.inference_mode():
                return pyroundlib.lltm_sequence(x, cell.weights, cell.bias, (h0, c0))
        return run
    def peer():
        with torch.inference_mode():
            return lstm(x)
    variants = {"default": ours(""), "=fused": ours("fused"), "=1": ours("1"), "nn.LSTM": peer}
    ref = variants["default"]()[0].clone(); alt = variants["=fused"]()[0]
    print((T, B, I, S), "fused vs default max diff", (ref - alt).abs().max().item(),
          flush=True)
    for f in variants.values():
        for _ in range(3): f()
    times = {k: [] for k in variants}
    for r in range(15):
        order = list(variants.items()); order = order if r % 2 else order[::-1]
        for k, f in order:
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); f(); e.record(); torch.cuda.synchronize()
            times[k].append(s.elapsed_time(e))
    os.environ[pyroundlib.sequence.PERSISTENT_ENV_VAR] = ""
    print("  " + ", ".join(f"{k} {statistics.median(v):.3f} ms ({statistics.median(a / b for a, b in zip(v, times['nn.LSTM'])):.3f})" for k, v in times.items()), flush=True)
