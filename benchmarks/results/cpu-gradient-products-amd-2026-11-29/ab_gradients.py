"""lltm_sequence fwd+bwd on the CPU with the gradient products of all steps by the library's
product (on: prl_matmul_cpu, sequence._cpu_product_in_library as it is) against torch's GEMMs
(off: it answering False), and nn.LSTM, one process, interleaved rounds in a fresh random order,
medians of per-round ratios."""
import random, statistics, sys, time, torch, pyroundlib
from pyroundlib import sequence, _threads
SIZES = [(8, 32, 8, 64), (50, 64, 64, 128), (30, 4, 256, 256), (100, 1, 8, 8), (100, 64, 256, 256), (8, 1, 256, 256),
         (100, 1, 256, 256), (20, 16, 32, 32), (64, 8, 128, 64), (16, 64, 16, 256), (100, 32, 64, 128),
         (30, 16, 256, 256), (100, 12, 64, 256)]
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 9
ON = sequence._cpu_product_in_library
print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, torch GEMMs first: {_threads.torch_gemms_first()}, {ROUNDS} rounds")
def timed(f, reps):
    t = time.perf_counter()
    for _ in range(reps): f()
    return (time.perf_counter() - t) / reps
for (T, B, I, S) in SIZES:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, B, I, generator=g).requires_grad_()
    w = (torch.randn(3 * S, S + I, generator=g) * S ** -0.5).requires_grad_()
    b = (torch.randn(3 * S, generator=g) * 0.1).requires_grad_()
    h0, c0, grad = torch.randn(B, S, generator=g), torch.randn(B, S, generator=g), torch.randn(T, B, S, generator=g)
    lstm = torch.nn.LSTM(I, S)
    lp = [x] + list(lstm.parameters())
    def ours(on):
        def run():
            sequence._cpu_product_in_library = ON if on else (lambda *args: False)
            try:
                o, _ = pyroundlib.lltm_sequence(x, w, b, (h0, c0))
                return torch.autograd.grad(o, [x, w, b], grad)
            finally:
                sequence._cpu_product_in_library = ON
        return run
    def lstm_run():
        o, _ = lstm(x, (h0[None], c0[None]))
        return torch.autograd.grad(o, lp, grad)
    fs = {"on": ours(True), "off": ours(False), "lstm": lstm_run}
    reps = max(1, int(0.02 / max(1e-6, timed(fs["lstm"], 1))))
    for f in fs.values(): timed(f, reps)
    ts = {k: [] for k in fs}
    for _ in range(ROUNDS):
        order = list(fs); random.shuffle(order)
        for k in order: ts[k].append(timed(fs[k], reps))
    r = lambda a, b: statistics.median(p / q for p, q in zip(ts[a], ts[b]))
    m = {k: statistics.median(v) * 1e3 for k, v in ts.items()}
    print(f"({T},{B},{I},{S}) fwd+bwd: on {m['on']:.3f} ms, off {m['off']:.3f} ms, nn.LSTM {m['lstm']:.3f} ms; "
          f"on/off {r('on','off'):.3f}; on/nn.LSTM {r('on','lstm'):.3f}, off/nn.LSTM {r('off','lstm'):.3f}", flush=True)
