"""With / without a padded layer's two directions in lockstep: LLTMLayer 2-layer bidirectional,
padded, fwd+bwd and inference, nn.LSTM and the pack (lengths uniform in [T/2, T]) beside;
interleaved rounds (order alternating), CUDA events, medians of per-round ratios."""
import copy, statistics, sys, torch, pyroundlib
from pyroundlib import layer as L
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
shapes = [(100, 64, 256, 1024), (50, 96, 256, 1024), (50, 512, 256, 1024), (100, 256, 512, 1024)]
L.LOCKSTEP_MAX_WORK = {d: 1 << 40 for d in (torch.float16, torch.bfloat16, torch.float32)}  # no B*S limit: the with/without
original = L._Padded.lockstep
def in_turn(self, *a): return False
print(torch.__version__, torch.cuda.get_device_name(), flush=True)
for steps, batch, features, state in shapes:
  for dtype, tf32 in ((torch.bfloat16, False), (torch.float32, False), (torch.float32, True)):
    torch.backends.cuda.matmul.allow_tf32 = tf32; torch.backends.cudnn.allow_tf32 = tf32
    kw = dict(device="cuda", dtype=dtype)
    torch.manual_seed(0)
    ours = pyroundlib.LLTMLayer(features, state, num_layers=2, bidirectional=True, **kw)
    lstm = torch.nn.LSTM(features, state, num_layers=2, bidirectional=True, **kw)
    x = torch.randn(steps, batch, features, **kw, requires_grad=True)
    routes = [pyroundlib.sequence._route(x, steps, batch, w, state, inf) for w in (features, 2 * state) for inf in (False, True)]
    if not L._Padded(2).lockstep(x, state):
        print(f"({steps},{batch},{features},{state}) {dtype}: routes {routes}, no lockstep", flush=True); continue
    gen = torch.Generator().manual_seed(steps * 1000 + batch)
    lengths = torch.randint(steps // 2, steps + 1, (batch,), generator=gen).tolist(); lengths[0] = steps
    pack = torch.nn.utils.rnn.pack_padded_sequence(x.detach(), lengths, enforce_sorted=False)
    pack = torch.nn.utils.rnn.PackedSequence(pack.data.requires_grad_(), pack.batch_sizes, pack.sorted_indices,
                                             pack.unsorted_indices)
    def train(layer, given, lock=True):
        is_pack = isinstance(given, torch.nn.utils.rnn.PackedSequence)
        params = [given.data if is_pack else given, *layer.parameters()]
        def run():
            L._Padded.lockstep = original if lock else in_turn
            try:
                output, (h, c) = layer(given)
                return torch.autograd.grad((output.data if is_pack else output).sum() + h.sum() + c.sum(), params)
            finally:
                L._Padded.lockstep = original
        return run
    def infer(layer, given, lock=True):
        def run():
            L._Padded.lockstep = original if lock else in_turn
            try:
                with torch.inference_mode():
                    return layer(given)
            finally:
                L._Padded.lockstep = original
        return run
    a, b = infer(ours, x)(), infer(ours, x, False)()
    diff = max((p - q).float().abs().max().item() for p, q in ((a[0], b[0]), (a[1][0], b[1][0]), (a[1][1], b[1][1])))
    ga, gb = train(ours, x)(), train(ours, x, False)()
    nans = [(bool(u.isnan().any()), bool(v.isnan().any())) for u, v in zip(ga, gb)]; print("nan lock/in turn", [n for n in nans if any(n)], flush=True)
    gdiff = max((u.float() - v.float()).abs().max().item() / max(v.float().abs().max().item(), 1e-30) for u, v in zip(ga, gb))
    ref32 = copy.deepcopy(ours).float()
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.inference_mode():
        r = ref32(x.detach().float())
    torch.backends.cuda.matmul.allow_tf32 = tf32
    rel = lambda got: max(((g.float() - w).norm() / w.norm()).item() for g, w in ((got[0], r[0]), (got[1][0], r[1][0]), (got[1][1], r[1][1])))
    print(f"({steps},{batch},{features},{state}) {dtype} tf32={tf32} routes {routes}: lockstep vs in turn, inference max abs diff {diff:.2e}, grads max rel {gdiff:.2e}; vs float32: lockstep {rel(a):.3e}, in turn {rel(b):.3e}", flush=True)
    for mode, make in (("fwd+bwd", train), ("inference", infer)):
        variants = {"lockstep": make(ours, x), "in turn": make(ours, x, False), "nn.LSTM": make(lstm, x),
                    "packed": make(ours, pack)}
        for f in variants.values():
            for _ in range(3): f()
        times = {k: [] for k in variants}
        for rr in range(rounds):
            order = list(variants.items()); order = order if rr % 2 else order[::-1]
            for k, f in order:
                torch.cuda.synchronize()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record(); f(); e.record(); torch.cuda.synchronize()
                times[k].append(s.elapsed_time(e))
        med = {k: statistics.median(v) for k, v in times.items()}
        ratio = lambda a, b: statistics.median(x / y for x, y in zip(times[a], times[b]))
        print(f"  {mode}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in med.items()) +
              f"; lockstep/in turn {ratio('lockstep', 'in turn'):.3f}, lockstep/nn.LSTM {ratio('lockstep', 'nn.LSTM'):.3f},"
              f" in turn/nn.LSTM {ratio('in turn', 'nn.LSTM'):.3f}, packed/lockstep {ratio('packed', 'lockstep'):.3f}", flush=True)
# float16 at (200,64,128,768): which route's gradients overflow
torch.backends.cuda.matmul.allow_tf32 = False
torch.manual_seed(0)
kw = dict(device="cuda", dtype=torch.float16)
ours = pyroundlib.LLTMLayer(128, 768, num_layers=2, bidirectional=True, **kw)
x = torch.randn(200, 64, 128, **kw, requires_grad=True)
for lock in (True, False):
    L._Padded.lockstep = original if lock else in_turn
    out, (h, c) = ours(x)
    g = torch.autograd.grad(out.sum() + h.sum() + c.sum(), [x, *ours.parameters()])
    print("float16 (200,64,128,768) lockstep" if lock else "in turn", "output nan", bool(out.isnan().any()),
          "grads nan/inf", [(bool(t.isnan().any()), bool(t.isinf().any())) for t in g], flush=True)
L._Padded.lockstep = original
