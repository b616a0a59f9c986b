import ctypes, statistics, sys, torch
lib = ctypes.CDLL(sys.argv[1])
I64, P, I = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
lib.proto_gemm.argtypes = [I, I, P, I64, I64, P, I64, I64, P, I64, I64, I, I, I, I, I, P]
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
stream = torch.cuda.current_stream().cuda_stream
for D in (1, 2):
  for M, K, N in [(64, 768, 2304), (64, 2304, 768), (64, 1024, 3072), (64, 3072, 1024), (32, 768, 2304), (256, 1024, 3072), (256, 3072, 1024), (16, 512, 1536)]:
    A = torch.randn(D, M, K, device="cuda")
    W_nt = torch.randn(D, N, K, device="cuda")   # forward: B(k,n) = W[n][k]
    W_nn = torch.randn(D, K, N, device="cuda")   # backward: B(k,n) = W[k][n]
    C = torch.empty(D, M, N, device="cuda")
    row = [f"D={D} ({M},{K},{N})"]
    for nt, W in ((1, W_nt), (0, W_nn)):
        Bt = W.transpose(1, 2) if nt else W
        base = t(lambda: torch.bmm(A, Bt, out=C))
        ref = torch.bmm(A.double(), Bt.double())
        res = [f"{'NT' if nt else 'NN'} bmm {base:.1f}"]
        for tile, name in ((0, "32x64"), (1, "32x32"), (2, "64x64"), (3, "16x64")):
            f = lambda: lib.proto_gemm(tile, nt, A.data_ptr(), K, M * K, W.data_ptr(), K if nt else N, N * K, C.data_ptr(), N, M * N, M, N, K, D, 0, stream)
            assert f() == 0
            torch.cuda.synchronize()
            err = (C.double() - ref).abs().max().item()
            tt = t(f)
            res.append(f"{name} {tt:.1f} ({tt/base:.2f}, err {err:.0e})")
        row.append(" ".join(res))
    print("  |  ".join(row), flush=True)
