"""Kernel time by name of one 2-layer bidirectional float32 call at (100,256,512,1024), TF32 off."""
import sys, torch, pyroundlib
from torch.profiler import profile, ProfilerActivity
torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False
T, B, I, S = (int(v) for v in sys.argv[1:5]) if len(sys.argv) > 4 else (100, 256, 512, 1024)
x = torch.randn(T, B, I, device="cuda", requires_grad=True)
for name, m in [("LLTMLayer", pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, device="cuda")),
                ("nn.LSTM", torch.nn.LSTM(I, S, num_layers=2, bidirectional=True, device="cuda"))]:
    for mode in ("fwd+bwd", "inference"):
        def call():
            if mode == "inference":
                with torch.inference_mode():
                    m(x)
            else:
                y, _ = m(x); y.sum().backward()
        for _ in range(3): call()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record()
        for _ in range(3): call()
        b.record(); b.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            call(); torch.cuda.synchronize()
        print(f"==== {name} {mode}: wall {a.elapsed_time(b) / 3:.2f} ms a call")
        rows = sorted(((e.key, e.device_time_total / 1000, e.count) for e in p.key_averages() if e.device_time_total > 0), key=lambda r: -r[1])
        for k, t, c in rows[:12]:
            print(f"   {t:8.2f} ms {c:6d}x  {k[:110]}")
        print(f"   total {sum(r[1] for r in rows):.2f} ms")
