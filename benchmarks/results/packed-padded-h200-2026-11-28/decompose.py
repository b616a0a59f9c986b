"""packed / padded at the benchmark's GPU rows: wall, host time (no sync), GPU busy (kernel sum)."""
import os, sys, time, statistics, collections, torch, pyroundlib
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pack_profile import make, runner
from torch.profiler import profile, ProfilerActivity
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
ROWS = [(8,32,8,64), (50,64,256,512), (100,256,512,1024), (200,64,128,768)]

def measure(run, n):
    for _ in range(2): run()
    torch.cuda.synchronize()
    walls, hosts = [], []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n): run()
        hosts.append((time.perf_counter() - t) / n)
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t) / n)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(2): run()
        torch.cuda.synchronize()
    busy = sum(e.device_time_total for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA) / 2
    return statistics.median(walls) * 1e6, statistics.median(hosts) * 1e6, busy

print("| (T,B,I,S), dtype, mode | padded wall / host / GPU busy (us) | packed wall / host / GPU busy (us) | packed / padded wall | GPU busy | rows computed |")
print("|---|---:|---:|---:|---:|---:|")
for dtype in (torch.float32, torch.bfloat16):
    for shape in ROWS:
        ours, x, pack = make(*shape, dtype)
        n = 10 if shape[0] * shape[1] * shape[3] < 2**22 else 3
        frac = pack.data.shape[0] / (shape[0] * shape[1])
        for kind in ("fwd+bwd", "inference"):
            a = measure(runner(ours, x, kind), n)
            b = measure(runner(ours, pack, kind), n)
            print(f"| {shape}, {str(dtype)[6:]}, {kind} | {a[0]:.0f} / {a[1]:.0f} / {a[2]:.0f} | {b[0]:.0f} / {b[1]:.0f} / {b[2]:.0f} | "
                  f"{b[0]/a[0]:.3f} | {b[2]/a[2]:.3f} | {frac:.3f} |", flush=True)
