"""Per-kernel average time of the backward's step product in lltm_sequence and LLTMLayer configurations."""
import torch, pyroundlib
from torch.profiler import profile, ProfilerActivity
torch.backends.cuda.matmul.allow_tf32 = False
T, B, S = 100, 256, 1024
def report(tag, fn):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn(); torch.cuda.synchronize()
    rows = sorted(((e.device_time_total / e.count, e.count, e.key[:60]) for e in p.key_averages() if e.device_time_total > 0 and ("gemm" in e.key or "splitK" in e.key)), key=lambda r: -r[0] * r[1])
    print(tag)
    for avg, c, k in rows[:5]:
        print(f"    {avg:8.1f} us x {c:4d}  {k}")
for I in (512, 2048):
    x = torch.randn(T, B, I, device="cuda", requires_grad=True)
    w = (torch.randn(3 * S, S + I, device="cuda") / S ** 0.5).requires_grad_()
    b = torch.zeros(3 * S, device="cuda", requires_grad=True)
    h0 = torch.zeros(B, S, device="cuda"); c0 = torch.zeros(B, S, device="cuda")
    def seq():
        out, _ = pyroundlib.lltm_sequence(x, w, b, (h0, c0)); out.sum().backward()
    report(f"lltm_sequence I={I}", seq)
x = torch.randn(T, B, 512, device="cuda", requires_grad=True)
for layers, bi in ((1, False), (1, True), (2, True)):
    m = pyroundlib.LLTMLayer(512, S, num_layers=layers, bidirectional=bi, device="cuda")
    def lay():
        y, _ = m(x); y.sum().backward()
    report(f"LLTMLayer layers={layers} bidirectional={bi}", lay)
