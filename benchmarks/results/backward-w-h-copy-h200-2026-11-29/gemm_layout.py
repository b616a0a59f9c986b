"""Step products of the float32 step loop, by the layout of W_h (TF32 off): each variant as 50
products in a CUDA graph, replayed, CUDA events, medians of 15 replays."""
import statistics, torch
torch.backends.cuda.matmul.allow_tf32 = False
dev = "cuda"

def timed(fn, reps=15):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): fn()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(50): fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record(); g.replay(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1000 / 50)
    return statistics.median(ts)

for B, S, I in [(256, 1024, 512), (256, 1024, 2048), (64, 768, 128), (64, 1024, 256), (64, 512, 256), (128, 1024, 512), (32, 768, 128)]:
    W = torch.randn(3 * S, S + I, device=dev) / S ** 0.5
    Wh = W[:, :S].contiguous(); WhT = W[:, :S].t().contiguous()
    h = torch.randn(B, S, device=dev); g = torch.randn(B, 3 * S, device=dev)
    dg = torch.randn(B, 3 * S, device=dev); dh = torch.empty(B, S, device=dev)
    ref_f = g + h @ W[:, :S].t(); ref_b = dg @ W[:, :S]
    res = {}
    for name, fn in [("F view W[:, :S].t()", lambda: g.addmm_(h, W[:, :S].t())),
                     ("F contiguous W_h .t()", lambda: g.addmm_(h, Wh.t())),
                     ("F contiguous W_h^T", lambda: g.addmm_(h, WhT)),
                     ("B view W[:, :S]", lambda: torch.mm(dg, W[:, :S], out=dh)),
                     ("B contiguous W_h", lambda: torch.mm(dg, Wh, out=dh)),
                     ("B contiguous W_h^T .t()", lambda: torch.mm(dg, WhT.t(), out=dh))]:
        res[name] = timed(fn)
    g2 = torch.randn(B, 3 * S, device=dev)
    for name, w in [("view", W[:, :S]), ("Wh", Wh), ("WhT.t", WhT.t())]:
        torch.mm(dg, w, out=dh); assert torch.allclose(dh, ref_b, atol=1e-3, rtol=1e-4), name
    flops = 2 * B * S * 3 * S
    print(f"(B, S, I) = ({B}, {S}, {I}):")
    for k, v in res.items():
        print(f"   {k:28s} {v:8.1f} us  {flops / v / 1e6:6.1f} TFLOP/s")
