import sys, time, torch, pyroundlib
from torch.profiler import profile, ProfilerActivity
torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False
for (T, B, I, S) in [(200, 64, 128, 768), (100, 256, 512, 1024)]:
    kw = dict(device="cuda", dtype=torch.float32)
    for name in ("LLTMLayer", "nn.LSTM"):
        torch.manual_seed(0)
        layer = (pyroundlib.LLTMLayer if name == "LLTMLayer" else torch.nn.LSTM)(I, S, num_layers=2, bidirectional=True, **kw)
        x = torch.randn(T, B, I, **kw, requires_grad=True)
        params = [x, *layer.parameters()]
        def train():
            o, (h, c) = layer(x)
            return torch.autograd.grad(o.sum() + h.sum() + c.sum(), params)
        def infer():
            with torch.inference_mode():
                return layer(x)
        for mode, f in (("inference", infer), ("fwd+bwd", train)):
            for _ in range(3): f()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(3): f()
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t) / 3 * 1e3
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(3): f()
                torch.cuda.synchronize()
            evs = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
            total = sum(e.self_device_time_total for e in evs) / 3 / 1e3
            print(f"== {name} ({T},{B},{I},{S}) {mode}: wall {wall:.2f} ms, kernels {total:.2f} ms a call")
            for e in sorted(evs, key=lambda e: -e.self_device_time_total)[:7]:
                print(f"   {e.self_device_time_total/3/1e3:8.3f} ms  x{e.count//3:5d}  {e.key[:110]}")
