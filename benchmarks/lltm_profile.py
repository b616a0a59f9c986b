"""Where a small LLTM forward+backward spends its time, on the GPU: host time and GPU time per
call of each variant, side by side, and the kernels one call runs (torch.profiler).  A
diagnostic for benchmarks/NOTES.md, not part of `make bench`.

    python benchmarks/lltm_profile.py [--rounds 11] [--reps 50]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import pyroundlib  # noqa: E402
from pyroundlib import lltm  # noqa: E402
from pyroundlib.reference import lltm_cell_reference  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import LLTMFloor, LLTMKernelsFloor, Timer, c_apply, lltm_inputs  # noqa: E402


class Double(torch.autograd.Function):
    """x * 2 with a Python backward: one Python autograd node."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


def lltm_cell_unfused(*args):
    """pyroundlib's LLTM with the bias gradient left to torch.sum (no fused kernel)."""
    saved, lltm.FUSED_BIAS_MAX_CUDA_BATCH = lltm.FUSED_BIAS_MAX_CUDA_BATCH, -1
    try:
        return pyroundlib.lltm_cell(*args)
    finally:
        lltm.FUSED_BIAS_MAX_CUDA_BATCH = saved


def variants(device, batch, features, state):
    args = lltm_inputs(device, batch, features, state, requires_grad=True)
    grads = [torch.randn(batch, state, device=device) for _ in range(2)]
    x = torch.randn(4096, device=device, requires_grad=True)
    gx = torch.randn_like(x)

    def fwd_bwd(f):
        return lambda: torch.autograd.grad(f(*args), args, grads)

    return {
        "pyroundlib": fwd_bwd(pyroundlib.lltm_cell),
        "pyroundlib, bias by torch.sum": fwd_bwd(lltm_cell_unfused),
        "floor: GEMMs + our 2 kernel calls": fwd_bwd(c_apply(LLTMKernelsFloor)),
        "floor: GEMMs only": fwd_bwd(c_apply(LLTMFloor)),
        "eager": fwd_bwd(lltm_cell_reference),
        "grad of x * 2 (one C++ node)": lambda: torch.autograd.grad(x * 2, x, gx),
        "grad of a Python Function (one node)": lambda: torch.autograd.grad(Double.apply(x), x, gx),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--reps", type=int, default=20, help="calls per timed round (keep reps x kernels per "
                        "call under the GPU's launch queue, ~1000, for the GPU-time column)")
    opts = parser.parse_args()
    device = torch.device("cuda")
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    host, gpu = Timer(device, host=True), Timer(device)
    for size in [(16, 32, 128), (256, 512, 1024)]:
        fns = variants(device, *size)
        for fn in fns.values():  # warm-up
            for _ in range(5):
                fn()
        times = {name: ([], []) for name in fns}
        for _ in range(opts.rounds):
            for name, fn in fns.items():
                times[name][0].append(host(fn, opts.reps))
                times[name][1].append(gpu(fn, opts.reps))
        print(f"\n(B,I,S)={size}: per call, median of {opts.rounds} rounds   host us    GPU us")
        for name, (h, g) in times.items():
            print(f"  {name:38s} {statistics.median(h) * 1e6:9.1f} {statistics.median(g) * 1e6:9.1f}")
        for name in ("pyroundlib", "floor: GEMMs only", "eager"):
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    fns[name]()
                torch.cuda.synchronize()
            kernels = [e for e in prof.key_averages() if "CUDA" in str(e.device_type)]
            total = sum(e.device_time_total for e in kernels) / 10
            print(f"  kernels of one '{name}' call: {total:.1f} us in all; the longest:")
            for e in sorted(kernels, key=lambda e: -e.device_time_total)[:6]:
                print(f"    {e.device_time_total / 10:7.1f} us  x{e.count // 10}  {e.key[:80]}")


if __name__ == "__main__":
    main()
