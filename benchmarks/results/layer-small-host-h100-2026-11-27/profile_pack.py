"""Host time of a 2-layer bidirectional LLTMLayer at (8,32,8,64) bfloat16 on CUDA, padded and
packed, inference and fwd+bwd: cProfile of 300 calls each (tottime)."""
import cProfile, pstats, io, time, torch, pyroundlib
torch.manual_seed(0)
T, B, I, S = 8, 32, 8, 64
kw = dict(device="cuda", dtype=torch.bfloat16)
layer = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, **kw)
x = torch.randn(T, B, I, **kw, requires_grad=True)
gen = torch.Generator().manual_seed(T * 1000 + B)
lengths = torch.randint(T // 2, T + 1, (B,), generator=gen).tolist(); lengths[0] = T
pack = torch.nn.utils.rnn.pack_padded_sequence(x.detach(), lengths, enforce_sorted=False)
pack = torch.nn.utils.rnn.PackedSequence(pack.data.requires_grad_(), pack.batch_sizes, pack.sorted_indices, pack.unsorted_indices)
def infer(given):
    with torch.inference_mode():
        return layer(given)
def train(given):
    is_pack = isinstance(given, torch.nn.utils.rnn.PackedSequence)
    out, (h, c) = layer(given)
    return torch.autograd.grad((out.data if is_pack else out).sum() + h.sum() + c.sum(), [given.data if is_pack else given, *layer.parameters()])
for name, f, given in (("inference padded", infer, x), ("inference packed", infer, pack), ("fwd+bwd padded", train, x), ("fwd+bwd packed", train, pack)):
    for _ in range(30): f(given)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(300): f(given)
    t1 = time.perf_counter(); torch.cuda.synchronize()
    print(f"== {name}: {1e6 * (t1 - t0) / 300:.1f} us a call (host)", flush=True)
    pr = cProfile.Profile(); pr.enable()
    for _ in range(300): f(given)
    pr.disable(); torch.cuda.synchronize()
    out = io.StringIO(); pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(14)
    print("\n".join(l[:150] for l in out.getvalue().splitlines()[6:24]), flush=True)
