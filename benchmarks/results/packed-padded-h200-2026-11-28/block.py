import os, sys, time, statistics, torch, pyroundlib
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pack_profile import make, runner
dev = torch.device("cuda")
def us(f, n=50):
    ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6
z = lambda: torch.zeros(4, 64, 512, dtype=torch.bfloat16, device=dev)
e = lambda: torch.empty(4, 64, 512, dtype=torch.bfloat16, device=dev)
print(f"zeros, GPU idle: {us(z):.1f} us; empty: {us(e):.1f} us")
big = torch.randn(8192, 8192, device=dev)
def after(busy, f):
    ts = []
    for _ in range(20):
        torch.cuda.synchronize(); busy(); t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return statistics.median(ts) * 1e6
print(f"zeros after a matmul (GPU busy): {after(lambda: big @ big, z):.1f} us")
for dtype in (torch.bfloat16, torch.float32):
    for packed in (False, True):
        ours, x, pack = make(50, 64, 256, 512, dtype)
        run = runner(ours, pack if packed else x, "inference")
        for _ in range(3): run()
        print(f"{dtype} {'packed' if packed else 'padded'}: zeros after a call: {after(run, z):.1f} us; after a matmul: {after(lambda: big @ big, z):.1f}")
        # a call's host time with the GPU idle at its start, and after a matmul, and back to back
        idle = after(lambda: None, run)
        busy = after(lambda: big @ big, run)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(20): run()
        b2b = (time.perf_counter() - t) / 20 * 1e6
        torch.cuda.synchronize()
        print(f"   call host time: GPU idle at start {idle:.0f} us, GPU busy (matmul) at start {busy:.0f} us, back to back {b2b:.0f} us")
