"""A/B of pyroundlib trees (same library) in alternating fresh processes, the first the
baseline: float32 step loops' backward product from a contiguous W_h against a view of the
weights; TF32 off. nn.LSTM of the same configuration timed in every worker (the peer).
python ab_wh.py main ROUNDS NAME=TREE ...   |   python ab_wh.py worker   (benchmarks/ab.py: the harness)"""
import json, sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import ab  # noqa: E402  benchmarks/ab.py

CASES = [("layer", 100, 256, 512, 1024, False), ("layer", 100, 256, 512, 1024, True),
         ("layer", 100, 128, 256, 1024, False), ("sequence", 100, 256, 512, 1024, False),
         ("sequence", 100, 256, 2048, 1024, False), ("layer", 200, 64, 128, 768, False)]

def worker():
    import torch, pyroundlib
    torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False
    out = {}
    kw = dict(device="cuda", dtype=torch.float32)
    for kind, T, B, I, S, packed in CASES:
        torch.manual_seed(0)
        x = torch.randn(T, B, I, **kw, requires_grad=True)
        name = f"{kind} {T},{B},{I},{S}" + (" packed" if packed else "")
        if kind == "sequence":
            w = (torch.randn(3 * S, S + I, **kw) / S ** 0.5).requires_grad_()
            b = torch.zeros(3 * S, **kw, requires_grad=True)
            h0, c0 = torch.zeros(B, S, **kw), torch.zeros(B, S, **kw)
            def ours():
                o, (h, c) = pyroundlib.lltm_sequence(x, w, b, (h0, c0))
                torch.autograd.grad(o.sum(), (x, w, b))
            out[name] = ab.cuda_time(ours)
            continue
        lengths = torch.randint(T // 2, T + 1, (B,), generator=torch.Generator().manual_seed(1))
        for who, m in ab.stacks(I, S, **kw):
            out[f"{name} fwd+bwd {who}"] = ab.cuda_time(ab.stack_training(m, x, lengths, packed))
    print("JSON" + json.dumps(out))

if __name__ == "__main__":
    ab.cli(__file__, worker)
