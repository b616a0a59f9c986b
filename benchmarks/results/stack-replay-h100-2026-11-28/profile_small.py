"""Where a small 2-layer bidirectional LLTMLayer's fwd+bwd goes on the GPU ((8,32,8,64), padded
and packed, float32 TF32 off and bfloat16): wall time a call (CUDA events, 20 calls back to
back), host time a call (perf_counter, no sync), the GPU's kernel time a call by kernel
(torch.profiler), and the same for nn.LSTM.  python3 profile_small.py"""
import statistics, time, torch, pyroundlib
from torch.nn.utils.rnn import pack_padded_sequence
from torch.profiler import profile, ProfilerActivity

torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False
T, B, I, S = 8, 32, 8, 64
for dtype in (torch.float32, torch.bfloat16):
    for packed in (False, True):
        for name in ("pyroundlib", "nn.LSTM"):
            torch.manual_seed(0)
            kw = dict(device="cuda", dtype=dtype)
            layer = (pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, **kw) if name == "pyroundlib"
                     else torch.nn.LSTM(I, S, num_layers=2, bidirectional=True, **kw))
            x = torch.randn(T, B, I, **kw, requires_grad=True)
            lengths = torch.randint(T // 2, T + 1, (B,))
            params = [x, *layer.parameters()]
            def call():
                o, (h, c) = layer(pack_padded_sequence(x, lengths, enforce_sorted=False) if packed else x)
                o = o.data if packed else o
                return torch.autograd.grad(o.float().sum() + h.float().sum() + c.float().sum(), params)
            for _ in range(20): call()
            torch.cuda.synchronize()
            walls, hosts = [], []
            for _ in range(7):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(); t0 = time.perf_counter()
                for _ in range(20): call()
                hosts.append((time.perf_counter() - t0) / 20 * 1e6)
                b.record(); torch.cuda.synchronize(); walls.append(a.elapsed_time(b) / 20 * 1e3)
            with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                for _ in range(5): call()
                torch.cuda.synchronize()
            events = prof.key_averages()
            cuda = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
            gpu = sum(e.self_device_time_total for e in cuda) / 5
            print(f"\n{name} {str(dtype)[6:]} {'packed' if packed else 'padded'}: wall {statistics.median(walls):.0f} us,"
                  f" host {statistics.median(hosts):.0f} us, kernels {gpu:.0f} us a call, {sum(e.count for e in cuda) / 5:.0f} launches")
            for e in sorted(cuda, key=lambda e: -e.self_device_time_total)[:8]:
                print(f"   {e.self_device_time_total / 5:8.1f} us  x{e.count / 5:.0f}  {e.key[:100]}")
            cpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
            for e in sorted(cpu, key=lambda e: -e.self_cpu_time_total)[:8]:
                print(f"   host {e.self_cpu_time_total / 5:8.1f} us  x{e.count / 5:.0f}  {e.key[:80]}")
