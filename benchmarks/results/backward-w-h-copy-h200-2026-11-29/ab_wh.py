"""A/B of pyroundlib trees (same library) in alternating fresh processes, the first the
baseline: float32 step loops' backward product from a contiguous W_h against a view of the
weights; TF32 off. nn.LSTM of the same configuration timed in every worker (the peer).
python ab_wh.py main ROUNDS NAME=TREE ...   |   python ab_wh.py worker   (benchmarks/ab.py: the harness)"""
import json, statistics, sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import ab  # noqa: E402  benchmarks/ab.py

CASES = [("layer", 100, 256, 512, 1024, False), ("layer", 100, 256, 512, 1024, True),
         ("layer", 100, 128, 256, 1024, False), ("sequence", 100, 256, 512, 1024, False),
         ("sequence", 100, 256, 2048, 1024, False), ("layer", 200, 64, 128, 768, False)]

def worker():
    import torch, pyroundlib
    from torch.nn.utils.rnn import pack_padded_sequence
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
        for who, m in (("ours", pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, **kw)),
                       ("nn.LSTM", torch.nn.LSTM(I, S, num_layers=2, bidirectional=True, **kw))):
            def train():
                inp = pack_padded_sequence(x, lengths, enforce_sorted=False) if packed else x
                o, (h, c) = m(inp)
                o = o.data if packed else o
                torch.autograd.grad(o.sum() + h.sum() + c.sum(), [x, *m.parameters()])
            out[f"{name} fwd+bwd {who}"] = ab.cuda_time(train)
    print("JSON" + json.dumps(out))

def main(rounds, names_trees):
    times = ab.main(__file__, rounds, names_trees)
    o = times[list(times)[0]]
    names = list(times)
    for name in names:  # ours / nn.LSTM per worker, median
        for k in o[0]:
            if k.endswith(" ours"):
                r = [a[k] / a[k[:-5] + " nn.LSTM"] for a in times[name]]
                print(f"{name}: {k[:-5]} / nn.LSTM {statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f})", flush=True)

if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker()
    else:
        main(int(sys.argv[2]), sys.argv[3:])
