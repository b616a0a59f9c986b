"""CPU: lltm_sequence with the library's plan as it is, forced to the grid, forced to rows; nn.LSTM beside."""
import math, os, random, statistics, sys, time, torch, pyroundlib
sizes = [(100, 12, 64, 256), (30, 16, 256, 256), (16, 64, 16, 256), (30, 8, 256, 256), (100, 8, 128, 128),
         (50, 16, 64, 128), (100, 16, 128, 256), (100, 32, 64, 128), (50, 64, 64, 128), (100, 64, 256, 256),
         (30, 4, 256, 256), (8, 32, 8, 64), (64, 8, 128, 64), (100, 12, 256, 512)]
if len(sys.argv) > 1: sizes = sizes[:int(sys.argv[1])]
rounds = int(os.environ.get("ROUNDS", 7))
print(torch.__version__, torch.get_num_threads(), "threads", flush=True)
def timed(f, budget=0.05):
    f(); f()
    t0 = time.perf_counter(); n = 0
    while time.perf_counter() - t0 < budget: f(); n += 1
    reps = max(3, n)
    t0 = time.perf_counter()
    for _ in range(reps): f()
    return (time.perf_counter() - t0) / reps * 1e6
def env(v):
    if v is None: os.environ.pop("PRL_FORCE_PLAN", None)
    else: os.environ["PRL_FORCE_PLAN"] = v
for T, B, I, S in sizes:
    x = torch.randn(T, B, I, requires_grad=True); w = (torch.randn(3 * S, S + I) / math.sqrt(S)).requires_grad_()
    b = (torch.randn(3 * S) * .1).requires_grad_(); h0, c0 = torch.randn(B, S), torch.randn(B, S)
    g = torch.randn(T, B, S); lstm = torch.nn.LSTM(I, S); lp = [x] + list(lstm.parameters())
    def ours(v, train):
        def run():
            env(v)
            if train:
                out, _ = pyroundlib.lltm_sequence(x, w, b, (h0, c0)); torch.autograd.grad(out, [x, w, b], g)
            else:
                with torch.inference_mode(): pyroundlib.lltm_sequence(x, w, b, (h0, c0))
            env(None)
        return run
    def lstm_run(train):
        def run():
            if train:
                out, _ = lstm(x, (h0[None], c0[None])); torch.autograd.grad(out, lp, g)
            else:
                with torch.inference_mode(): lstm(x, (h0[None], c0[None]))
        return run
    # same results check: grid and rows vs default (inference)
    with torch.inference_mode():
        ref = pyroundlib.lltm_sequence(x, w, b, (h0, c0))[0]
        for v in ("g", "r"):
            env(v); o = pyroundlib.lltm_sequence(x, w, b, (h0, c0))[0]; env(None)
            err = (o - ref).abs().max().item()
            if err > 1e-4: print("MISMATCH", v, err)
    for train in (False, True):
        cases = {"default": ours(None, train), "grid": ours("g", train), "rows": ours("r", train), "lstm": lstm_run(train)}
        res = {k: [] for k in cases}
        for r in range(rounds):
            ks = list(cases); random.shuffle(ks)
            for k in ks: res[k].append(timed(cases[k]))
        m = {k: statistics.median(v) for k, v in res.items()}
        rat = lambda a, bb: statistics.median([p / q for p, q in zip(res[a], res[bb])])
        print(f"({T},{B},{I},{S}) {'fwd+bwd' if train else 'inference'}: default {m['default']:.0f} us, grid {m['grid']:.0f}, rows {m['rows']:.0f}, "
              f"nn.LSTM {m['lstm']:.0f}; default/LSTM {rat('default','lstm'):.3f}, grid/LSTM {rat('grid','lstm'):.3f}, "
              f"rows/LSTM {rat('rows','lstm'):.3f}; grid/default {rat('grid','default'):.3f}", flush=True)
