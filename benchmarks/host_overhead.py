"""Where the host time of one small call goes: each step of the eager path timed alone
(perf_counter over many calls, one synchronise at the end).  A diagnostic for
benchmarks/NOTES.md, not part of `make bench`.

    python benchmarks/host_overhead.py [--device cuda|cpu]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import pyroundlib  # noqa: E402
from pyroundlib import _common, _ffi  # noqa: E402
from pyroundlib.lltm import _apply_lltm, _lltm_backward, _lltm_forward  # noqa: E402
from pyroundlib.reference import lltm_cell_reference  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import LLTMFloor, RoundInFunction, c_apply  # noqa: E402


def per_call(fn, device, n=2000, repeat=5):
    best = float("inf")
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(parser.parse_args().device)
    lib = _ffi.library()
    x = torch.randn(4096, device=device)
    y = torch.empty_like(x)
    xg = x.clone().requires_grad_()
    g = torch.ones_like(x)
    idx = device.index or 0
    stream = _common._raw_stream(idx) if device.type == "cuda" else 0
    call = (lambda: lib.prl_round_cuda(x.data_ptr(), y.data_ptr(), 4096, 0, idx, stream)) if device.type == "cuda" \
        else (lambda: lib.prl_round_cpu(x.data_ptr(), y.data_ptr(), 4096, 0))
    B, I, S = 16, 32, 128
    args = [torch.randn(s, device=device, requires_grad=True) for s in [(B, I), (3 * S, S + I), (3 * S,), (B, S), (B, S)]]
    grads = [torch.randn(B, S, device=device) for _ in range(2)]
    X = torch.cat([args[3], args[0]], 1).detach()
    gates = torch.addmm(args[2], X, args[1].t()).detach()
    old_cell = args[4].detach()
    floor = c_apply(LLTMFloor)
    steps = {
        "torch.round(x)": lambda: torch.round(x),
        "torch.empty_like(x)": lambda: torch.empty_like(x),
        "x.contiguous(); x.data_ptr()": lambda: (x.contiguous(), x.data_ptr()),
        "raw stream": (lambda: _common._raw_stream(idx)) if device.type == "cuda" else (lambda: None),
        "plain_eager(x)": lambda: _common.plain_eager(x),
        "ctypes call prl_round_*": call,
        "round_ste(x)": lambda: pyroundlib.round_ste(x),
        "grad(round_ste(x))": lambda: torch.autograd.grad(pyroundlib.round_ste(xg), xg, g),
        "grad(Function(torch.round)(x))": lambda: torch.autograd.grad(RoundInFunction.apply(xg), xg, g),
        "grad(idiom(x))": lambda: torch.autograd.grad(xg + (torch.round(xg) - xg).detach(), xg, g),
        "LLTM: cat + linear": lambda: torch.nn.functional.linear(torch.cat([X[:, :S], X[:, S:]], 1), *args[1:3]),
        "LLTM: _lltm_forward": lambda: _lltm_forward(gates, old_cell),
        "LLTM: _lltm_backward": lambda: _lltm_backward(grads[0], grads[1], gates, old_cell),
        "LLTM: 2 mm + sum": lambda: (gates.t().mm(X), gates.mm(args[1]), gates.sum(0)),
        "LLTM: lltm_cell fwd (grad)": lambda: pyroundlib.lltm_cell(*args),
        "LLTM: LLTMFunction (eager path)": lambda: _apply_lltm(*args, True),  # lltm_cell's route, unchecked
        "LLTM: grad(lltm_cell)": lambda: torch.autograd.grad(pyroundlib.lltm_cell(*args), args, grads),
        "LLTM: grad(floor Function)": lambda: torch.autograd.grad(floor(*args), args, grads),
        "LLTM: grad(reference)": lambda: torch.autograd.grad(lltm_cell_reference(*args), args, grads),
    }
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"host time per call on {name}, torch {torch.__version__}:")
    for label, fn in steps.items():
        fn()
        print(f"  {label:36s} {per_call(fn, device):8.2f} us")


if __name__ == "__main__":
    main()
