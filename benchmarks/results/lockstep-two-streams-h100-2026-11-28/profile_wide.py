"""python3 profile_wide.py -> profile_wide.txt: kernel breakdown of a 2-layer bidirectional float32 layer (TF32 off) at (100,256,512,1024): ours vs nn.LSTM."""
import sys, torch, pyroundlib
from torch.profiler import profile, ProfilerActivity
torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False
T, B, I, S = 100, 256, 512, 1024
kw = dict(device="cuda", dtype=torch.float32)
torch.manual_seed(0)
ours = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, **kw)
theirs = torch.nn.LSTM(I, S, num_layers=2, bidirectional=True, **kw)
x = torch.randn(T, B, I, **kw, requires_grad=True)
def train(m):
    o, (h, c) = m(x)
    return torch.autograd.grad(o.sum() + h.sum() + c.sum(), [x, *m.parameters()])
def infer(m):
    with torch.inference_mode():
        return m(x)
for name, m in (("ours", ours), ("nn.LSTM", theirs)):
    for mode, f in (("fwd+bwd", train), ("inference", infer)):
        for _ in range(4): f(m)
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); f(m); f(m); b.record(); torch.cuda.synchronize()
        wall = a.elapsed_time(b) / 2
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            f(m); f(m); torch.cuda.synchronize()
        ev = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
        total = sum(e.self_device_time_total for e in ev) / 2 / 1e3
        print(f"== {name} {mode}: wall {wall:.2f} ms, kernel sum {total:.2f} ms", flush=True)
        for e in sorted(ev, key=lambda e: -e.self_device_time_total)[:12]:
            print(f"   {e.self_device_time_total/2/1e3:8.3f} ms  x{e.count//2:5d}  {e.key[:150]}", flush=True)
