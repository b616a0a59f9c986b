import torch, statistics
torch.backends.cuda.matmul.allow_tf32 = False
def t(f, n=50):
    for _ in range(5): f()
    ts = []
    for _ in range(7):
        torch.cuda.synchronize(); a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n): f()
        b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) / n * 1000)
    return statistics.median(ts)
print(torch.cuda.get_device_name(), torch.__version__)
for D in (1, 2):
  for M, K, N in [(64, 768, 2304), (64, 2304, 768), (256, 1024, 3072), (256, 3072, 1024), (64, 1024, 3072), (64, 3072, 1024), (32, 768, 2304)]:
    A = torch.randn(D, M, K, device="cuda"); Bm = torch.randn(D, K, N, device="cuda"); C = torch.empty(D, M, N, device="cuda")
    row = [f"D={D} ({M},{K},{N})"]
    base = t(lambda: torch.bmm(A, Bm, out=C))
    row.append(f"bmm {base:.1f}us")
    ref = torch.bmm(A.double(), Bm.double())
    for s in (2, 4, 8, 16):
        if K % s: continue
        As = A.view(D, M, s, K // s).permute(0, 2, 1, 3).reshape(D * s, M, K // s)
        Bs = Bm.view(D, s, K // s, N).reshape(D * s, K // s, N)
        P = torch.empty(D * s, M, N, device="cuda")
        def f():
            torch.bmm(As.contiguous() if False else As, Bs, out=P)
            torch.sum(P.view(D, s, M, N), dim=1, out=C)
        tt = t(f)
        err = (C.double() - ref).abs().max().item()
        row.append(f"split{s} {tt:.1f}us ({tt/base:.2f}) err {err:.1e}")
    print("  ".join(row), flush=True)
