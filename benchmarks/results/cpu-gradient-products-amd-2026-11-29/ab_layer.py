"""LLTMLayer (2 layers, bidirectional) fwd+bwd on the CPU, padded and packed (lengths uniform in
[T/2, T]), with the gradient products by the library (on) against torch's GEMMs (off:
sequence._cpu_product_in_library answering False), and nn.LSTM of the same configuration;
one process, interleaved rounds in a fresh random order, medians of per-round ratios."""
import random, statistics, sys, time, torch, pyroundlib
from torch.nn.utils.rnn import pack_padded_sequence
from pyroundlib import sequence
SIZES = [(8, 32, 8, 64), (50, 64, 64, 128), (30, 16, 256, 256), (100, 12, 64, 256)]
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 9
ON = sequence._cpu_product_in_library
print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {ROUNDS} rounds")
def timed(f, reps):
    t = time.perf_counter()
    for _ in range(reps): f()
    return (time.perf_counter() - t) / reps
for (T, B, I, S) in SIZES:
    torch.manual_seed(0)
    layer = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True)
    lstm = torch.nn.LSTM(I, S, num_layers=2, bidirectional=True)
    x = torch.randn(T, B, I, requires_grad=True)
    lengths = torch.randint(T // 2, T + 1, (B,))
    for packed in (False, True):
        def inp():
            return pack_padded_sequence(x, lengths, enforce_sorted=False) if packed else x
        def run(model, on=True):
            def f():
                sequence._cpu_product_in_library = ON if on else (lambda *a: False)
                try:
                    out, (h, c) = model(inp())
                    o = out.data if packed else out
                    return torch.autograd.grad(o.sum() + h.sum(), [x, *model.parameters()])
                finally:
                    sequence._cpu_product_in_library = ON
            return f
        fs = {"on": run(layer), "off": run(layer, False), "lstm": run(lstm)}
        reps = max(1, int(0.03 / max(1e-6, timed(fs["lstm"], 1))))
        for f in fs.values(): timed(f, reps)
        ts = {k: [] for k in fs}
        for _ in range(ROUNDS):
            order = list(fs); random.shuffle(order)
            for k in order: ts[k].append(timed(fs[k], reps))
        r = lambda a, b: statistics.median(p / q for p, q in zip(ts[a], ts[b]))
        m = {k: statistics.median(v) * 1e3 for k, v in ts.items()}
        print(f"({T},{B},{I},{S}) {'packed' if packed else 'padded'} fwd+bwd: on {m['on']:.3f} ms, off {m['off']:.3f} ms, nn.LSTM {m['lstm']:.3f} ms; "
              f"on/off {r('on','off'):.3f}; on/nn.LSTM {r('on','lstm'):.3f}, off/nn.LSTM {r('off','lstm'):.3f}", flush=True)
