"""Threads: 8 Python threads calling both ops at once get right results (CPU; CUDA with
a stream each), and the library's last-error message is per thread."""
import threading

import pytest
import torch

import pyroundlib
from pyroundlib import _ffi
from pyroundlib.reference import lltm_cell_reference

from conftest import CUDA

THREADS = 8


def run_threads(target, count=THREADS):
    errors, barrier = [], threading.Barrier(count)

    def wrapped(k):
        try:
            barrier.wait()
            target(k)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((k, e))

    threads = [threading.Thread(target=wrapped, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors


def work(k, device, iterations):
    gen = torch.Generator().manual_seed(k)
    for i in range(iterations):
        x = (torch.randn(1000 + 37 * k, generator=gen, dtype=torch.float64) * 5).to(device=device)
        assert torch.equal(pyroundlib.round_ste(x), torch.round(x))
        args = [torch.randn(s, generator=gen, dtype=torch.float64).to(device).requires_grad_()
                for s in [(4 + k, 6), (3 * 5, 5 + 6), (3 * 5,), (4 + k, 5), (4 + k, 5)]]
        h, c = pyroundlib.lltm_cell(*args)
        grads = torch.autograd.grad(h.sum() + 2 * c.sum(), args)
        ref_args = [a.detach().clone().requires_grad_() for a in args]
        rh, rc = lltm_cell_reference(*ref_args)
        ref_grads = torch.autograd.grad(rh.sum() + 2 * rc.sum(), ref_args)
        torch.testing.assert_close(h, rh)
        torch.testing.assert_close(c, rc)
        for g, r in zip(grads, ref_grads):
            torch.testing.assert_close(g, r)


def test_threads_cpu():
    run_threads(lambda k: work(k, "cpu", 25))


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_threads_cuda_stream_each():
    def target(k):
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            work(k, "cuda", 25)
        stream.synchronize()

    run_threads(target)


def test_last_error_is_per_thread():
    """Each thread fails with its own dtype code, many times, interleaved with the
    others; every exception must carry that thread's code, never another's."""
    lib = _ffi.library()

    def target(k):
        code = 1000 + k
        for _ in range(2000):
            with pytest.raises(pyroundlib.UnsupportedDtypeError) as info:
                lib.prl_round_cpu(None, None, 0, code)
            assert f"'dtype' is {code}," in str(info.value), str(info.value)

    run_threads(target)


def test_library_loads_once_under_concurrent_first_use(monkeypatch):
    monkeypatch.setattr(_ffi, "_library", None)
    seen = []
    run_threads(lambda k: seen.append(_ffi.library()), count=16)
    assert len({id(lib) for lib in seen}) == 1
