# do repeated lltm_sequence calls (fwd+bwd) give the same bits? allocations between calls shift buffers
import torch, pyroundlib, random, sys
print(torch.__version__, torch.get_num_threads(), flush=True)
torch.manual_seed(0); rng = random.Random(0)
def run(args):
    x, W, b, h0, c0 = [a.detach().clone().requires_grad_() for a in args]
    o, (h, c) = pyroundlib.lltm_sequence(x, W, b, (h0, c0))
    g = torch.autograd.grad(o.sum() * 1.3 + c.sum(), (x, W, b, h0, c0))
    return [t.detach().clone() for t in (o, h, c, *g)]
for dtype in (torch.float32, torch.float64):
  for T,B,I,S in [(8,1,256,256),(100,1,256,256),(30,4,256,256),(50,2,64,512),(16,3,32,256)]:
    args = [torch.randn(T,B,I,dtype=dtype), torch.randn(3*S,S+I,dtype=dtype)*0.05, torch.randn(3*S,dtype=dtype)*0.1,
            torch.randn(B,S,dtype=dtype)*0.1, torch.randn(B,S,dtype=dtype)*0.1]
    first = run(args); diffs = 0; junk = []
    for i in range(20):
        junk.append(torch.empty(rng.randrange(1, 5000)))  # shift the allocator's next addresses
        got = run(args)
        diffs += not all(torch.equal(a, b) for a, b in zip(first, got))
    nt = torch.get_num_threads(); torch.set_num_threads(max(1, nt // 4)); other = run(args); torch.set_num_threads(nt)
    same_threads = all(torch.equal(a, b) for a, b in zip(first, other))
    print(dtype, (T,B,I,S), f"calls differing from the first: {diffs}/20; same bits at {max(1, nt//4)} threads: {same_threads}", flush=True)
