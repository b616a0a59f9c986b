"""pyroundlib demo: train a small model with an LLTM cell and a sigmoid -> RoundSTE
binary bottleneck, on the GPU when there is one, else the CPU.

Task: read a sequence of 12 random 8-dimensional vectors and tell which of 4 quadrants
the running sum of the first two features ends in.  The LLTM carries the sum; its state
is squeezed through a 6-bit binary code (sigmoid -> RoundSTE) before the classifier.
"""
from __future__ import annotations

import time

import torch

import pyroundlib
from pyroundlib.reference import lltm_cell_reference, round_ste_reference


class BinaryCodeLLTM(torch.nn.Module):
    def __init__(self, features=8, state=64, bits=6, classes=4):
        super().__init__()
        self.cell = pyroundlib.LLTM(features, state)
        self.to_code = torch.nn.Linear(state, bits)
        self.binarise = pyroundlib.RoundSTE()
        self.classify = torch.nn.Linear(bits, classes)

    def forward(self, seq):  # seq: [time, batch, features]
        h = seq.new_zeros(seq.shape[1], self.cell.state_size)
        c = torch.zeros_like(h)
        for x in seq:
            h, c = self.cell(x, (h, c))
        code = self.binarise(torch.sigmoid(self.to_code(h)))  # 0/1 bits, straight-through gradient
        return self.classify(code)


def batch(n, device, steps=12, features=8):
    seq = torch.randn(steps, n, features, device=device)
    total = seq[:, :, :2].sum(0)
    labels = (total[:, 0] > 0).long() * 2 + (total[:, 1] > 0).long()
    return seq, labels


def check_against_reference(device):
    """One LLTM step and one RoundSTE, forward and backward, against plain PyTorch."""
    cell = pyroundlib.LLTM(8, 16).to(device)
    x, h, c = (torch.randn(5, n, device=device) for n in (8, 16, 16))
    params = [p.detach().clone().requires_grad_() for p in (cell.weights, cell.bias)]
    nh, nc = cell(x, (h, c))
    rh, rc = lltm_cell_reference(x, params[0], params[1], h, c)
    loss = (pyroundlib.round_ste(torch.sigmoid(nh)) * nc).sum()
    ref_loss = (round_ste_reference(torch.sigmoid(rh)) * rc).sum()
    grads = torch.autograd.grad(loss, [cell.weights, cell.bias])
    ref_grads = torch.autograd.grad(ref_loss, params)
    diff = max([(nh - rh).abs().max().item(), (nc - rc).abs().max().item()] +
               [(g - r).abs().max().item() for g, r in zip(grads, ref_grads)])
    return diff


def main():
    device = torch.device("cuda" if torch.cuda.is_available() and pyroundlib.library_info()["cuda"] else "cpu")
    torch.manual_seed(0)
    info = pyroundlib.library_info()
    print(f"pyroundlib {pyroundlib.__version__}: {info['path']} (ABI {info['abi_version']}, "
          f"CUDA {'yes' if info['cuda'] else 'no'}); training on {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""))

    model = BinaryCodeLLTM().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    test_seq, test_labels = batch(2000, device)
    start = time.perf_counter()
    for step in range(301):
        seq, labels = batch(256, device)
        loss = torch.nn.functional.cross_entropy(model(seq), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            with torch.no_grad():
                acc = (model(test_seq).argmax(1) == test_labels).float().mean().item()
            print(f"step {step:4d}  loss {loss.item():.4f}  test accuracy {acc:.3f}")
    print(f"trained in {time.perf_counter() - start:.1f} s")

    diff = check_against_reference(device)
    ok = diff < 1e-4
    print(f"check against plain PyTorch (LLTM + straight-through round, forward and backward): "
          f"max |difference| = {diff:.2e} -> {'OK' if ok else 'MISMATCH'}")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
