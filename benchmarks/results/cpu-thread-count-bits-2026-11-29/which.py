# which results of lltm_sequence (fwd+bwd) change with torch's thread count?
import torch, pyroundlib
print(torch.__version__, torch.get_num_threads(), flush=True)
torch.manual_seed(0)
names = ["output", "h_n", "c_n", "d_input", "d_weights", "d_bias", "d_h0", "d_c0"]
def run(args):
    x, W, b, h0, c0 = [a.detach().clone().requires_grad_() for a in args]
    o, (h, c) = pyroundlib.lltm_sequence(x, W, b, (h0, c0))
    g = torch.autograd.grad(o.sum() * 1.3 + c.sum(), (x, W, b, h0, c0))
    return [t.detach().clone() for t in (o, h, c, *g)]
nt = torch.get_num_threads()
for dtype in (torch.float32, torch.float64):
  for T,B,I,S in [(8,1,256,256),(30,4,256,256),(16,3,32,256),(50,2,64,512),(8,32,8,64),(50,64,64,128),(16,64,16,256)]:
    args = [torch.randn(T,B,I,dtype=dtype), torch.randn(3*S,S+I,dtype=dtype)*0.05, torch.randn(3*S,dtype=dtype)*0.1,
            torch.randn(B,S,dtype=dtype)*0.1, torch.randn(B,S,dtype=dtype)*0.1]
    ref = run(args); bad = {}
    for t in (1, 2, 3, 5, 8):
        torch.set_num_threads(t)
        got = run(args)
        diff = [n for n, a, b in zip(names, ref, got) if not torch.equal(a, b)]
        if diff: bad[t] = diff
    torch.set_num_threads(nt)
    print(dtype, (T,B,I,S), "against", nt, "threads:", bad or "all the same", flush=True)
