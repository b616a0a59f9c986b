"""Threads: 8 Python threads calling both ops at once get right results (CPU; CUDA with
a stream each), and the library's last-error message is per thread."""
import os
import threading

import pytest
import torch

import pyroundlib
from pyroundlib import _ffi
from pyroundlib.reference import lltm_cell_reference

from conftest import CUDA, run_python_ok

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


# ---- the library's own worker threads (the CPU sequence loop) -----------------------------------

def sequence_results(steps=8, batch=23, features=5, state=64, dtype=torch.float32, seed=0):
    """Outputs and gradients of one CPU sequence call on the library's one-call route.
    23 rows are 8 register tiles of 3 (the last short): with torch's threads at n the
    library splits them into min(n, 8) parts."""
    gen = torch.Generator().manual_seed(seed)
    args = [(torch.randn(s, generator=gen, dtype=torch.float64) * k).to(dtype).requires_grad_()
            for s, k in [((steps, batch, features), 1.0), ((3 * state, state + features), state ** -0.5),
                         ((3 * state,), 1.0), ((batch, state), 1.0), ((batch, state), 1.0)]]
    output, (h, c) = pyroundlib.lltm_sequence(args[0], args[1], args[2], (args[3], args[4]))
    grad = torch.randn(output.shape, generator=gen, dtype=torch.float64).to(dtype)
    grads = torch.autograd.grad([output, c], args, [grad, torch.ones_like(c)])
    return [output, h, c, *grads]


@pytest.fixture
def torch_threads(monkeypatch):
    """Sets torch's intra-op thread count for one test (the library follows it), and
    puts both back afterwards."""
    from pyroundlib import sequence
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "1")  # the one-call route whatever the size
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def test_sequence_follows_torch_threads(torch_threads):
    lib = _ffi.library()
    for threads in (3, 1, 2):
        torch_threads(threads)
        sequence_results(batch=4)
        assert lib.prl_cpu_threads() == threads


def test_sequence_split_among_threads_is_bitwise_the_same(torch_threads, monkeypatch):
    """Each batch row's recurrence is computed the same way whichever thread runs it, so
    every output and gradient is bit-for-bit the single-threaded one.  torch stays on one
    thread (its own GEMMs' reduction order depends on its thread count); the library is
    given 2-16."""
    from pyroundlib import sequence
    lib = _ffi.library()
    torch_threads(1)
    for dtype in (torch.float32, torch.bfloat16):
        monkeypatch.setattr(sequence, "_follow_torch_threads", lambda: lib.prl_set_cpu_threads(1))
        alone = sequence_results(dtype=dtype)
        for threads in (2, 3, 5, 8, 16):
            monkeypatch.setattr(sequence, "_follow_torch_threads", lambda: lib.prl_set_cpu_threads(threads))
            split = sequence_results(dtype=dtype)
            assert lib.prl_cpu_threads() == threads
            for name, a, b in zip(["output", "h_n", "c_n", "d_input", "d_weights", "d_bias", "d_h0", "d_c0"],
                                  alone, split):
                assert torch.equal(a, b), (dtype, threads, name)
    sequence._library_threads[0] = lib.prl_cpu_threads()  # as the patched calls left it


def test_sequence_callers_share_the_workers(torch_threads):
    """8 Python threads in the CPU loop at once: one holds the workers, the others run on
    their own threads; every result is the one a lone call gives."""
    torch_threads(4)
    want = [sequence_results(seed=k, batch=20 + k) for k in range(THREADS)]

    def target(k):
        for _ in range(10):
            for a, b in zip(want[k], sequence_results(seed=k, batch=20 + k)):
                assert torch.equal(a, b)

    run_threads(target)


def test_sequence_threads_after_fork():
    """A child forked after the parent's workers started has none of them: it starts its
    own and neither process hangs (an alarm ends either after a minute; the child sets its
    own, alarms are not inherited).  torch runs on one thread in both: its OpenMP runtime
    cannot be used in a child forked after it started a team, whoever's library is loaded."""
    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    run_python_ok(
        "import os, signal, torch, pyroundlib\n"
        "signal.alarm(60)\n"
        "torch.set_num_threads(1)\n"
        "lib = pyroundlib._ffi.library()\n"
        "T, B, S = 8, 23, 64\n"
        "gates, w = torch.randn(T, B, 3 * S), torch.randn(3 * S, S) / 8\n"
        "h0, c0 = torch.randn(B, S), torch.randn(B, S)\n"
        "def run():\n"
        "    g, out, cells = gates.clone(), torch.empty(T, B, S), torch.empty(T, B, S)\n"
        "    lib.prl_lltm_sequence_forward_cpu(g.data_ptr(), w.data_ptr(), S, h0.data_ptr(), c0.data_ptr(),\n"
        "                                      out.data_ptr(), cells.data_ptr(), None, T, B, S, 0)\n"
        "    return g, out, cells\n"
        "lib.prl_set_cpu_threads(1)\n"
        "want = run()\n"
        "lib.prl_set_cpu_threads(4)\n"
        "assert all(torch.equal(a, b) for a, b in zip(want, run()))\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    signal.alarm(60)\n"
        "    os._exit(0 if all(torch.equal(a, b) for a, b in zip(want, run())) else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status\n"
        "assert all(torch.equal(a, b) for a, b in zip(want, run()))\n"
        "print('OK')\n")


def test_set_cpu_threads_checks_its_argument():
    lib = _ffi.library()
    with pytest.raises(pyroundlib.InvalidArgumentError, match="'threads' must be >= 1, got 0"):
        lib.prl_set_cpu_threads(0)
