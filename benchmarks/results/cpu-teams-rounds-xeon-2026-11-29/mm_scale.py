import time, torch
a = torch.randn(2048, 2048); b = torch.randn(2048, 2048)
for k in (1, 2, 4, 8, 12, 16):
    torch.set_num_threads(k); torch.mm(a, b)
    t0 = time.perf_counter(); n = 0
    while time.perf_counter() - t0 < 1.0: torch.mm(a, b); n += 1
    dt = (time.perf_counter() - t0) / n
    print(f"mm 2048 threads {k}: {2*2048**3/dt/1e9:.0f} GFLOP/s", flush=True)
torch.set_num_threads(16)
