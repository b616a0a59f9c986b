"""One process: ours / nn.LSTM per call at host-bound sizes, interleaved rounds (run with PYTHONPATH=<tree>)."""
import statistics, sys, time, random
import torch
import pyroundlib

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = torch.device("cuda")
out = []
for (T, B, I, S, dtype) in ((8, 32, 8, 64, torch.float32), (8, 32, 8, 64, torch.bfloat16), (50, 64, 256, 512, torch.bfloat16)):
    ours = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, device=dev, dtype=dtype)
    lstm = torch.nn.LSTM(I, S, num_layers=2, bidirectional=True, device=dev, dtype=dtype)
    x = torch.randn(T, B, I, device=dev, dtype=dtype, requires_grad=True)

    def train(layer):
        ps = [x, *layer.parameters()]
        def run():
            o, (h, c) = layer(x)
            return torch.autograd.grad(o.sum() + h.sum() + c.sum(), ps)
        return run

    def infer(layer):
        def run():
            with torch.inference_mode():
                return layer(x)
        return run

    for mode, make in (("fwd+bwd", train), ("inference", infer)):
        fs = {"ours": make(ours), "lstm": make(lstm)}
        for f in fs.values():
            for _ in range(30):
                f()
        times = {k: [] for k in fs}
        rng = random.Random(0)
        for r in range(11):
            for k in rng.sample(list(fs), 2):
                torch.cuda.synchronize(); t0 = time.perf_counter()
                for _ in range(40):
                    fs[k]()
                torch.cuda.synchronize(); times[k].append((time.perf_counter() - t0) / 40 * 1e6)
        ratio = statistics.median(a / b for a, b in zip(times["ours"], times["lstm"]))
        out.append(f"({T},{B},{I},{S}) {str(dtype)[6:]} {mode}: ours {statistics.median(times['ours']):.1f} us, "
                   f"lstm {statistics.median(times['lstm']):.1f} us, ratio {ratio:.3f}")
print("\n".join(out))
