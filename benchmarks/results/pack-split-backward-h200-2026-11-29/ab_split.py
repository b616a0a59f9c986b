"""A/B of pyroundlib trees (one library) in alternating fresh processes, the first the baseline:
a pack's lockstep backward with each step's product split in slices of its inner dimension
(prl_lltm_packed_steps_backward_cuda's parts) or not. 2-layer bidirectional LLTMLayer, float32,
TF32 off, packed (lengths uniform in [T/2, T], the same pack every call) and padded, forward +
backward, nn.LSTM of the same configuration in every worker.
python ab_split.py main ROUNDS NAME=TREE ...   |   python ab_split.py worker   (benchmarks/ab.py)"""
import json, sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import ab  # noqa: E402  benchmarks/ab.py

CASES = [(200, 64, 128, 768, True), (100, 64, 256, 1024, True), (100, 32, 256, 1024, True),
         (200, 64, 128, 768, False)]


def worker():
    import torch, pyroundlib
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    out = {}
    kw = dict(device="cuda", dtype=torch.float32)
    for T, B, I, S, packed in CASES:
        torch.manual_seed(0)
        x = torch.randn(T, B, I, **kw, requires_grad=True)
        lengths = torch.randint(T // 2, T + 1, (B,), generator=torch.Generator().manual_seed(1))
        name = f"({T},{B},{I},{S}) " + ("packed" if packed else "padded")
        for who, m in ab.stacks(I, S, **kw):
            out[f"{name} fwd+bwd {who}"] = ab.cuda_time(ab.stack_training(m, x, lengths, packed))
    print("JSON" + json.dumps(out))


if __name__ == "__main__":
    ab.cli(__file__, worker)
