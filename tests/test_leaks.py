"""Leaks: 100,000 calls (successes and failures) leave the process's resident memory and
torch.cuda.memory_allocated() flat."""
import gc
import os

import pytest
import torch

import pyroundlib
from pyroundlib import _ffi

from conftest import CUDA

CALLS = 100_000
RSS_GROWTH_LIMIT = 8 << 20  # bytes; a leaked tensor or message per call would be tens of MB


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def calls(device, n):
    """n calls of the ops, of which every 5th fails in C (a bad dtype code) and every
    50th runs a forward+backward."""
    lib = _ffi.library()
    x = torch.randn(256, device=device)
    args = [torch.randn(s, device=device) for s in [(2, 3), (12, 7), (12,), (2, 4), (2, 4)]]
    grad_args = [a.clone().requires_grad_() for a in args]
    for i in range(n):
        if i % 5 == 4:
            try:
                lib.prl_round_cpu(None, None, 0, 77)
            except pyroundlib.UnsupportedDtypeError:
                pass
        elif i % 50 == 1:
            h, c = pyroundlib.lltm_cell(*grad_args)
            torch.autograd.grad(h.sum() + c.sum(), grad_args)
        elif i % 2:
            pyroundlib.lltm_cell(*args)
        else:
            pyroundlib.round_ste(x)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if CUDA else []))
def test_100k_calls_leave_memory_flat(device):
    calls(device, 5_000)  # warm-up: allocator pools, caches, lazy initialisation
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        gpu_before = torch.cuda.memory_allocated()
    rss_before = rss_bytes()
    calls(device, CALLS)
    gc.collect()
    rss_after = rss_bytes()
    assert rss_after - rss_before < RSS_GROWTH_LIMIT, f"RSS grew by {(rss_after - rss_before) / 2**20:.1f} MiB"
    if device == "cuda":
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == gpu_before
