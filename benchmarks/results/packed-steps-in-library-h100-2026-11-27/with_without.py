"""With / without a pack's step loop in the library (torch's cuBLAS): LLTMLayer 2-layer
bidirectional over a pack (lengths uniform in [T/2, T]), fwd+bwd and inference, the loop from
Python (PYROUNDLIB_CUBLAS=0), the same batch padded and nn.LSTM on the pack beside;
interleaved rounds (order alternating), CUDA events around `calls` calls, medians of per-round ratios."""
import os, statistics, sys, torch, pyroundlib
from pyroundlib import _cublas
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
calls = 3
shapes = [(100, 256, 512, 1024), (200, 64, 128, 768), (100, 64, 256, 1024)]
print(torch.__version__, torch.cuda.get_device_name(), flush=True)
def setenv(on):
    if on: os.environ.pop(_cublas.ENV_VAR, None)
    else: os.environ[_cublas.ENV_VAR] = "0"
for steps, batch, features, state in shapes:
  for dtype in (torch.bfloat16, torch.float32):
    torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False
    kw = dict(device="cuda", dtype=dtype)
    torch.manual_seed(0)
    ours = pyroundlib.LLTMLayer(features, state, num_layers=2, bidirectional=True, **kw)
    lstm = torch.nn.LSTM(features, state, num_layers=2, bidirectional=True, **kw)
    x = torch.randn(steps, batch, features, **kw, requires_grad=True)
    gen = torch.Generator().manual_seed(steps * 1000 + batch)
    lengths = torch.randint(steps // 2, steps + 1, (batch,), generator=gen).tolist(); lengths[0] = steps
    pack = torch.nn.utils.rnn.pack_padded_sequence(x.detach(), lengths, enforce_sorted=False)
    pack = torch.nn.utils.rnn.PackedSequence(pack.data.requires_grad_(), pack.batch_sizes, pack.sorted_indices,
                                             pack.unsorted_indices)
    route = pyroundlib.sequence._packed_route(pack.data, len(pack.batch_sizes), batch, features, state)
    lock = pyroundlib.layer._Packed(2, pyroundlib._packed.Pack(pack.batch_sizes, x.device)).lockstep(pack.data, state)
    def train(layer, given, on=True):
        is_pack = isinstance(given, torch.nn.utils.rnn.PackedSequence)
        params = [given.data if is_pack else given, *layer.parameters()]
        def run():
            setenv(on)
            try:
                output, (h, c) = layer(given)
                return torch.autograd.grad((output.data if is_pack else output).sum() + h.sum() + c.sum(), params)
            finally:
                setenv(True)
        return run
    def infer(layer, given, on=True):
        def run():
            setenv(on)
            try:
                with torch.inference_mode():
                    return layer(given)
            finally:
                setenv(True)
        return run
    a, b = infer(ours, pack)(), infer(ours, pack, False)()
    rel = lambda u, v: ((u.float() - v.float()).norm() / v.float().norm()).item()
    ga, gb = train(ours, pack)(), train(ours, pack, False)()
    print(f"({steps},{batch},{features},{state}) {dtype} route {route} lockstep {lock}: library vs python, inference rel "
          f"{max(rel(a[0].data, b[0].data), rel(a[1][0], b[1][0]), rel(a[1][1], b[1][1])):.2e}, grads rel "
          f"{max(rel(u, v) for u, v in zip(ga, gb)):.2e}, nan {any(bool(u.isnan().any()) for u in ga)}", flush=True)
    for mode, make in (("fwd+bwd", train), ("inference", infer)):
        variants = {"library": make(ours, pack), "python": make(ours, pack, False), "padded": make(ours, x),
                    "nn.LSTM": make(lstm, pack)}
        for f in variants.values():
            for _ in range(3): f()
        times = {k: [] for k in variants}
        for rr in range(rounds):
            order = list(variants.items()); order = order if rr % 2 else order[::-1]
            for k, f in order:
                torch.cuda.synchronize()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(calls): f()
                e.record(); torch.cuda.synchronize()
                times[k].append(s.elapsed_time(e) / calls)
        med = {k: statistics.median(v) for k, v in times.items()}
        ratio = lambda a, b: statistics.median(x / y for x, y in zip(times[a], times[b]))
        print(f"  {mode}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in med.items()) +
              f"; library/python {ratio('library', 'python'):.3f}, library/padded {ratio('library', 'padded'):.3f},"
              f" python/padded {ratio('python', 'padded'):.3f}, library/nn.LSTM {ratio('library', 'nn.LSTM'):.3f},"
              f" python/nn.LSTM {ratio('python', 'nn.LSTM'):.3f}", flush=True)
