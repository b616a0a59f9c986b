import torch, statistics
torch.backends.cuda.matmul.allow_tf32 = False
print(torch.cuda.get_device_name(), torch.__version__)
def graph_time(fn, steps=20, reps=7):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(steps): fn()
    for _ in range(3): g.replay()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) * 1000 / steps)
    return statistics.median(ts)
for D in (1, 2):
    for B, S in [(64, 768), (64, 1024), (256, 1024), (64, 512), (32, 768), (128, 512), (16, 1024), (256, 512)]:
        K = 3 * S
        dg = torch.randn(D, B, K, device="cuda"); w = torch.randn(D, K, S, device="cuda") / K ** 0.5
        out = torch.empty(D, B, S, device="cuda")
        base = graph_time(lambda: torch.bmm(dg, w, out=out))
        ref = torch.bmm(dg.double(), w.double())
        row = [f"D={D} B={B} S={S}: bmm {base:6.1f} us"]
        for s in (2, 3, 4, 6, 8, 12):
            if K % s: continue
            P = torch.empty(D, s, B, S, device="cuda")
            views = [(dg[d].view(B, s, K // s).transpose(0, 1), w[d].view(s, K // s, S)) for d in range(D)]
            def f():
                for d in range(D):
                    torch.bmm(views[d][0], views[d][1], out=P[d])
                torch.sum(P, dim=1, out=out)
            t = graph_time(f)
            err = (out.double() - ref).abs().max().item()
            row.append(f"s{s} {t:6.1f} ({t/base:.2f}, {err:.0e})")
        print("  ".join(row), flush=True)
