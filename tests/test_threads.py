"""Threads: 8 Python threads calling both ops at once get right results (CPU; CUDA with
a stream each), and the library's last-error message is per thread."""
import ctypes
import os
import re
import sys
import threading

import pytest
import torch

import pyroundlib
from pyroundlib import _ffi, _threads, sequence
from pyroundlib._common import DTYPE_CODES
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


# ---- the library's CPU threads (the CPU sequence loop) ------------------------------------------

RUNNER = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint)  # prl_parallel_fn
BODY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
THREAD_NUM = ctypes.CFUNCTYPE(ctypes.c_int)  # prl_thread_num_fn


def sequence_results(steps=8, batch=23, features=5, state=64, dtype=torch.float32, seed=0):
    """Outputs and gradients of one CPU sequence call on the library's one-call route.
    23 rows are 8 register tiles of 3 (the last short): with n threads the library splits
    them into min(n, 8) parts."""
    gen = torch.Generator().manual_seed(seed)
    args = [(torch.randn(s, generator=gen, dtype=torch.float64) * k).to(dtype).requires_grad_()
            for s, k in [((steps, batch, features), 1.0), ((3 * state, state + features), state ** -0.5),
                         ((3 * state,), 1.0), ((batch, state), 1.0), ((batch, state), 1.0)]]
    output, (h, c) = pyroundlib.lltm_sequence(args[0], args[1], args[2], (args[3], args[4]))
    grad = torch.randn(output.shape, generator=gen, dtype=torch.float64).to(dtype)
    grads = torch.autograd.grad([output, c], args, [grad, torch.ones_like(c)])
    return [output, h, c, *grads]


@pytest.fixture
def cpu_threads(monkeypatch):
    """Sets the library's thread count and runner for one test, torch's intra-op threads
    staying at one (its own GEMMs' reduction order depends on their count), and puts back
    what pyroundlib had given the library."""
    lib = _ffi.library()
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "1")  # the one-call route whatever the size
    before = torch.get_num_threads()
    torch.set_num_threads(1)

    def give(threads, runner=None, thread_num=None):
        monkeypatch.setattr(_threads, "follow_torch", lambda: lib.prl_set_cpu_threads(threads))
        lib.prl_set_cpu_parallel(runner)
        lib.prl_set_cpu_thread_num(thread_num)

    _threads.follow_torch()  # the BLAS looked for
    yield give
    torch.set_num_threads(before)
    lib.prl_set_cpu_threads(_threads._given["threads"])
    lib.prl_set_cpu_parallel(_threads._given["parallel"] or None)
    lib.prl_set_cpu_thread_num(_threads._given["thread_num"] or None)
    lib.prl_set_cpu_gemm(*_threads._given["gemm"])


def python_runner(calls, numbered=False):
    """A prl_parallel_fn that runs the body on num_threads Python threads (ctypes lets go
    of the GIL while the body runs), recording each call's (num_threads, flags); numbered:
    also the prl_thread_num_fn that gives each thread its number in the team (0 the caller),
    with the threads started in reverse order of their numbers."""
    number = threading.local()

    def body_as(k, body, data):
        number.k = k
        body(data)

    def run(body, data, num_threads, flags):
        calls.append((num_threads, flags))
        body = BODY(body)
        threads = [threading.Thread(target=body_as, args=(k, body, data)) for k in range(num_threads - 1, 0, -1)]
        for t in threads:
            t.start()
        body_as(0, body, data)
        for t in threads:
            t.join()
    runner = RUNNER(run)
    return (runner, THREAD_NUM(lambda: number.k)) if numbered else runner


def test_sequence_follows_torch_threads(monkeypatch):
    """As many threads as torch's, where the library runs them on torch's OpenMP runtime;
    else one (the library's own workers would compete with torch's spinning threads)."""
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "1")
    lib, before = _ffi.library(), torch.get_num_threads()
    shared = _threads.openmp_parallel() is not None
    try:
        for threads in (3, 1, 2):
            torch.set_num_threads(threads)
            sequence_results(batch=4)
            assert lib.prl_cpu_threads() == (threads if shared else 1)
    finally:
        torch.set_num_threads(before)


def test_one_thread_without_an_openmp_runtime(monkeypatch):
    """Where no OpenMP runtime is found, the loop stays on the calling thread whatever
    torch's thread count, and the library is given no runner."""
    _threads.follow_torch()  # the BLAS looked for (its first need), whichever tests ran before
    lib, before, kept = _ffi.library(), torch.get_num_threads(), dict(_threads._given)
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "1")
    monkeypatch.setattr(_threads, "openmp_runtime", lambda: (None, None))
    monkeypatch.setattr(_threads, "_given", {"torch": 1, "threads": 1, "parallel": None, "thread_num": None,
                                             "gemm": kept["gemm"]})
    calls = []
    runner = python_runner(calls)
    lib.prl_set_cpu_parallel(runner)  # replaced by NULL when pyroundlib finds no runtime
    lib.prl_set_cpu_threads(1)  # as the fresh _given says
    try:
        torch.set_num_threads(3)
        sequence_results()
        assert lib.prl_cpu_threads() == 1
        assert _threads._given == {"torch": 3, "threads": 1, "parallel": 0, "thread_num": 0, "gemm": kept["gemm"]}
        lib.prl_set_cpu_threads(3)  # the library's own workers, not the runner, now split the work
        sequence_results()
        assert calls == []
    finally:
        torch.set_num_threads(before)
        lib.prl_set_cpu_threads(kept["threads"])
        lib.prl_set_cpu_parallel(kept["parallel"] or None)


def test_openmp_runtime_is_found():
    """On Linux, with torch built on OpenMP, the library is given the GOMP_parallel of the
    runtime torch's intra-op threads run on (it is already loaded: nothing new is)."""
    if not (sys.platform.startswith("linux") and torch.backends.openmp.is_available()):
        pytest.skip("torch without OpenMP, or not Linux")
    address, thread_num = _threads.openmp_runtime()
    assert address, "no OpenMP runtime with GOMP_parallel found among the loaded libraries"
    assert thread_num and ctypes.CFUNCTYPE(ctypes.c_int)(thread_num)() == 0  # outside a region: 0
    torch.set_num_threads(torch.get_num_threads())
    _threads.follow_torch()
    if torch.get_num_threads() > 1:
        assert _threads._given["parallel"] == address and _threads._given["thread_num"] == thread_num
    maps = open("/proc/self/maps").read()
    assert re.search(r"lib(g|i)?omp", maps)


def test_blas_is_found():
    """On x86-64 Linux, torch's BLAS (MKL, inside libtorch_cpu) is found, handed to the library
    on Intel CPUs only, and its sgemm_ computes what torch.mm computes, bit for bit (64-bit
    integer arguments read right by an LP64 BLAS)."""
    sgemm, dgemm = _threads.blas_gemm(any_cpu=True)
    if not (sys.platform.startswith("linux") and os.uname().machine == "x86_64"):
        pytest.skip("torch's BLAS is looked for everywhere, required here on x86-64 Linux only")
    assert sgemm and dgemm
    _threads.follow_torch()
    assert _threads._given["gemm"] == ((sgemm, dgemm) if _threads._intel_cpu() else (None, None))
    fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 13)(sgemm)
    a, b = torch.randn(5, 7), torch.randn(7, 3)
    c = torch.full((5, 3), float("nan"))
    m, n, k = (ctypes.c_int64(v) for v in (5, 3, 7))
    one, zero = ctypes.c_float(1), ctypes.c_float(0)
    ref = ctypes.byref
    fn(ctypes.c_char_p(b"N"), ctypes.c_char_p(b"N"), ref(n), ref(m), ref(k), ref(one), b.data_ptr(), ref(n),
       a.data_ptr(), ref(k), ref(zero), c.data_ptr(), ref(n))
    assert torch.equal(c, a @ b)


@pytest.fixture
def with_blas():
    """torch's BLAS handed to the library whatever the CPU (else only on Intel's), for one test."""
    lib = _ffi.library()
    gemm = _threads.blas_gemm(any_cpu=True)
    if not gemm[0]:
        pytest.skip("torch exports no BLAS (test_blas_is_found says where one must be)")
    _threads.follow_torch()
    lib.prl_set_cpu_gemm(*gemm)
    yield
    lib.prl_set_cpu_gemm(*_threads._given["gemm"])


@pytest.mark.parametrize("size", [(8, 32, 8, 64), (12, 4, 256, 256), (10, 700, 64, 256)])
def test_sequence_loop_with_blas_is_the_same_at_any_thread_count(monkeypatch, with_blas, size):
    """With torch's BLAS, each step's product is one BLAS call over the whole batch (threaded
    by the BLAS) and the cells are split in fixed chunks: what the loop computes (the outputs,
    c_n, d_h0, d_c0) is bit for bit the same at 1, 2, 3 and 5 torch threads, as far as the
    BLAS's own products are.  MKL's are at these counts; on a 16-core Xeon its products at 16
    threads rounded differently from those at 1-8 (benchmarks/NOTES.md), which the library
    cannot change.  (The products over all steps outside the loop are torch's own GEMMs.)"""
    if os.uname().machine != "x86_64":
        pytest.skip("MKL: torch's BLAS on x86-64")
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "1")
    before = torch.get_num_threads()
    try:
        results = {}
        for threads in (1, 2, 3, 5):
            torch.set_num_threads(threads)
            output, h, c, _, _, _, d_h0, d_c0 = sequence_results(*size[:2], size[2], size[3])
            results[threads] = (output, c, d_h0, d_c0)
    finally:
        torch.set_num_threads(before)
    for threads, got in results.items():
        for name, a, b in zip(["output", "c_n", "d_h0", "d_c0"], results[1], got):
            assert torch.equal(a, b), (threads, name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sequence_on_the_librarys_products_is_the_same_at_any_thread_count(monkeypatch, dtype):
    """With PYROUNDLIB_CPU_BLAS=0 every product of these calls is the library's (the input half,
    each step's, the input and weight gradients: 32 columns or more), so every result, the
    gradients included, is bit for bit the same at any torch thread count: a batch of one (one-row
    tiles), of three (the grid of rows and state columns) and of 23 (the row split).  That is what AMD CPUs with
    AVX-512 run by default.  Where torch's BLAS computes products it need not hold: on a 16-core
    Xeon MKL rounded differently at 16 threads than at 1-8 (benchmarks/NOTES.md)."""
    monkeypatch.setenv(_threads.BLAS_ENV_VAR, "0")
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "1")
    before = torch.get_num_threads()
    _threads._given["gemm"] = None  # handed over again, under the setting
    results = {}
    try:
        for threads in (1, 2, 3, 5, 8, 16):
            torch.set_num_threads(threads)
            results[threads] = [sequence_results(steps, batch, 32, state, dtype)
                                for steps, batch, state in ((8, 1, 64), (24, 3, 256), (5, 23, 64))]
            assert _threads._given["gemm"] == (None, None)
    finally:
        torch.set_num_threads(before)
        _threads._given["gemm"] = None  # handed over again by the next call, under the setting it restores
    names = ["output", "h_n", "c_n", "d_input", "d_weights", "d_bias", "d_h0", "d_c0"]
    for threads, got in results.items():
        for size, (want_size, got_size) in enumerate(zip(results[1], got)):
            for name, a, b in zip(names, want_size, got_size):
                assert torch.equal(a, b), (threads, size, name)


@pytest.mark.parametrize("intel, flags, first", [
    (True, {"avx2", "avx512f"}, True), (False, {"avx2", "avx512f"}, False), (False, {"avx2", "fma"}, True),
    (False, set(), True)])
def test_torch_gemms_first_by_cpu(monkeypatch, intel, flags, first):
    """Which CPUs take the library's products for an input half and the gradient products:
    x86 CPUs other than Intel's with AVX-512; torch's GEMMs on Intel's and on any CPU without
    AVX-512 (an AVX2-only AMD CPU, an Arm CPU: no flags); PYROUNDLIB_CPU_BLAS decides over it."""
    monkeypatch.delenv(_threads.BLAS_ENV_VAR, raising=False)
    monkeypatch.setattr(_threads, "_intel_cpu", lambda: intel)
    monkeypatch.setattr(_threads, "_cpu_flags", lambda: frozenset(flags))
    assert _threads.torch_gemms_first() == first
    for choice, want in [("0", False), ("1", True)]:
        monkeypatch.setenv(_threads.BLAS_ENV_VAR, choice)
        assert _threads.torch_gemms_first() == want


def test_blas_off_by_environment(monkeypatch):
    monkeypatch.setenv(_threads.BLAS_ENV_VAR, "0")
    assert _threads.blas_gemm() == (None, None)


RUNNERS = ["own workers", "OpenMP runtime", "Python threads", "numbered Python threads"]


def runner_given(runner, calls):
    """(prl_parallel_fn, prl_thread_num_fn) of one of RUNNERS, for the cpu_threads fixture
    (skips where torch's OpenMP runtime is not found); the Python runners record their calls."""
    given = {"own workers": (None, None), "OpenMP runtime": _threads.openmp_runtime(),
             "Python threads": (python_runner(calls), None),
             "numbered Python threads": python_runner(calls, numbered=True)}[runner]
    if runner == "OpenMP runtime" and not given[0]:
        pytest.skip("no OpenMP runtime found (test_openmp_runtime_is_found says where one must be)")
    return given


# (steps, batch, state, the library's own product): the loop's splits (native/src/lltm_sequence_cpu.cpp, Plan)
SPLITS = {"rows": (8, 23, 64, True),  # 23 rows: tiles of 3 or 6, the last short, split among the threads
          # 23 rows in up to 5 parts of 4-5 rows, fewer than a 6-row tile (AVX-512), at least 2^21
          # multiply-adds a part over the sequence (with 3-row tiles: up to 8 parts of whole tiles)
          "narrow rows": (40, 23, 64, True),
          # 10 rows (at least 8) and W_h of 512 KB at most (196 KB in float32): parts of a single row
          # from 10 threads on (24M multiply-adds over the sequence, at least 2^21 a part)
          "single rows": (48, 10, 128, True),
          # the same rows with W_h over 512 KB (786 KB in float32): parts of 4 rows or more, too few
          # for 3 threads or more, so the grid of rows and state columns from there
          "grid, wide weights": (24, 10, 256, True),
          # 2 rows, too few for the threads: the grid of rows and state columns from 2 threads on
          # (a round a step; parts of 2^14 multiply-adds a step: up to 2 x 8 at 16 threads)
          "grid": (24, 2, 256, True),
          # the same, the state not in whole 32-column panels (the grid's parts compute the panels
          # that hold their columns; 7 panels a gate: 2 x 4 parts at 16 threads)
          "grid, part panels": (24, 2, 200, True),
          "BLAS": (8, 3, 256, False),  # torch's BLAS, one call a step, at every thread count
          # with the BLAS handed over, a sequence of 64 rows or more (steps x batch) takes the grid
          "grid over a BLAS": (24, 3, 256, False)}


@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("runner", RUNNERS)
def test_sequence_split_among_threads_is_bitwise_the_same(cpu_threads, runner, split):
    """Each element is computed by the same code in the same order however the work is
    split, so every output and gradient is bit-for-bit the one-thread one, for 2-16 threads
    run by the library's own workers, by torch's OpenMP runtime, or by any runner keeping
    prl_parallel_fn's contract: split by rows, by rows and state columns a step at a time (the
    one-thread call splits nothing), or with the products by torch's BLAS."""
    lib, calls = _ffi.library(), []
    steps, batch, state, own = SPLITS[split]
    gemm = (None, None) if own else _threads.blas_gemm(any_cpu=True)
    if not own and not gemm[0]:
        pytest.skip("torch exports no BLAS (test_blas_is_found says where one must be)")
    lib.prl_set_cpu_gemm(*gemm)  # the fixture hands back what pyroundlib gave
    given = runner_given(runner, calls)
    for dtype in (torch.float32, torch.bfloat16):
        cpu_threads(1, *given)
        alone = sequence_results(steps, dtype=dtype, batch=batch, state=state)
        for threads in (2, 3, 5, 8, 16):
            cpu_threads(threads, *given)
            parts = sequence_results(steps, dtype=dtype, batch=batch, state=state)
            assert lib.prl_cpu_threads() == threads
            for name, a, b in zip(["output", "h_n", "c_n", "d_input", "d_weights", "d_bias", "d_h0", "d_c0"],
                                  alone, parts):
                assert torch.equal(a, b), (dtype, threads, name)
    if runner.endswith("Python threads") and split != "BLAS":  # a team of prl_cpu_threads() however few the parts (8 at most)
        assert sorted(set(calls)) == [(2, 0), (3, 0), (5, 0), (8, 0), (16, 0)], calls


@pytest.mark.parametrize("runner", RUNNERS)
def test_input_half_split_among_threads_is_bitwise_the_same(cpu_threads, runner):
    """prl_lltm_input_half_cpu splits its blocks of rows among the threads where each part has
    2^18 multiply-adds or more (601 rows x 40 features x 192 columns: up to 13 blocks of 48 or
    26 of 24 rows); each element is one sum over the features in order, so the gates are bit
    for bit the one-thread ones at 2-16 threads on every runner, every element written (the
    buffer starts as NaN), and within the dtype's rounding of float64 sums."""
    lib, calls = _ffi.library(), []
    given = runner_given(runner, calls)
    rows, features, state = 601, 40, 64
    gen = torch.Generator().manual_seed(11)
    for dtype, tol in [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)]:
        x = torch.randn(rows, features, generator=gen, dtype=torch.float64).to(dtype)
        w = (torch.randn(3 * state, state + features, generator=gen, dtype=torch.float64) * 0.2).to(dtype)
        b = torch.randn(3 * state, generator=gen, dtype=torch.float64).to(dtype)
        want = x.double() @ w.double()[:, state:].t() + b.double()
        results = []
        for threads in (1, 2, 3, 5, 8, 16):
            cpu_threads(threads, *given)
            _threads.follow_torch()  # the fixture's: the library's thread count
            gates = torch.full((rows, 3 * state), float("nan"), dtype=dtype)
            lib.prl_lltm_input_half_cpu(x.data_ptr(), w.data_ptr(), b.data_ptr(), gates.data_ptr(), rows, features,
                                        state, DTYPE_CODES[dtype])
            assert not gates.isnan().any(), (dtype, threads)
            assert torch.allclose(gates.double(), want, rtol=tol, atol=tol), (dtype, threads)
            results.append(gates)
        for threads, gates in zip((2, 3, 5, 8, 16), results[1:]):
            assert torch.equal(results[0], gates), (dtype, threads)
    if runner.endswith("Python threads"):  # split: a team of prl_cpu_threads() (the pack's region too)
        assert {n for n, _ in calls} == {2, 3, 5, 8, 16}, calls


@pytest.mark.parametrize("runner", RUNNERS)
def test_matmul_split_among_threads_is_bitwise_the_same(cpu_threads, runner):
    """prl_matmul_cpu splits blocks of c's rows among the threads as the input half does: c and
    its transposed form bit for bit the one-thread ones at 2-16 threads on every runner, every
    element written (NaN-filled), within float32's rounding of float64 products."""
    lib, calls = _ffi.library(), []
    given = runner_given(runner, calls)
    m, n, k = 500, 70, 96  # up to 11 blocks of 48 rows or 21 of 24, 500 x 96 x 96 multiply-adds
    gen = torch.Generator().manual_seed(12)
    a, at = torch.randn(m, k, generator=gen), torch.randn(k, m, generator=gen)
    b = torch.randn(k, n, generator=gen)
    for transposed, left in [(0, a), (1, at)]:
        want = (left.double().t() if transposed else left.double()) @ b.double()
        results = []
        for threads in (1, 2, 3, 5, 8, 16):
            cpu_threads(threads, *given)
            _threads.follow_torch()  # the fixture's: the library's thread count
            c = torch.full((m, n), float("nan"))
            lib.prl_matmul_cpu(left.data_ptr(), left.stride(0), transposed, b.data_ptr(), n, c.data_ptr(), n, m, n, k,
                               DTYPE_CODES[torch.float32])
            assert not c.isnan().any() and torch.allclose(c.double(), want, rtol=1e-5, atol=1e-4), (transposed, threads)
            results.append(c)
        for threads, c in zip((2, 3, 5, 8, 16), results[1:]):
            assert torch.equal(results[0], c), (transposed, threads)
    if runner.endswith("Python threads"):
        assert {n for n, _ in calls} >= {2, 3, 5, 8, 16}, calls


@pytest.mark.parametrize("numbered", [False, True])
def test_every_region_asks_for_all_threads(cpu_threads, numbered):
    """Every parallel region asks the runner for all of prl_cpu_threads(), however few its
    parts, as torch's own regions do (native/src/cpu_threads.cpp): an elementwise call of 2,
    4 or 16 chunks, and the sequence loop, and none below two chunks.  A team of one thread
    a chunk made libgomp end threads that torch's next region started again (benchmarks/
    NOTES.md).  The results: torch.round's bits, with parts claimed in order or split by the
    runner's thread numbers."""
    calls = []
    given = python_runner(calls, numbered) if numbered else (python_runner(calls), None)  # alive while set
    cpu_threads(16, *given)
    gen = torch.Generator().manual_seed(0)
    for numel, regions in ((1000, 0), (1 << 16, 1), (3 * 32768 + 5, 1), (1 << 20, 1), (5 << 20, 1)):
        for dtype in (torch.float32, torch.bfloat16):
            calls.clear()
            x = (torch.randn(numel, generator=gen, dtype=torch.float64) * 8).to(dtype)
            assert torch.equal(pyroundlib.round_ste(x), torch.round(x)), (numel, dtype)
            assert calls == [(16, 0)] * regions, (numel, dtype)
    calls.clear()
    sequence_results(steps=4, batch=64, state=64)
    assert calls and set(calls) == {(16, 0)}, calls


@pytest.mark.parametrize("number", [None, 0, 3, 99])
def test_runner_that_runs_one_thread_leaves_nothing_undone(cpu_threads, number):
    """num_threads is the most the runner may use: a runner that runs the body once, on
    the calling thread, still gets every part done, whatever thread number it gives that
    thread (or none): the sequence loop's rows, and a round's chunks."""
    cpu_threads(1)
    want = sequence_results()
    x = torch.randn(5 << 16) * 8
    runner = RUNNER(lambda body, data, num_threads, flags: BODY(body)(data))  # alive while the library has it
    thread_num = None if number is None else THREAD_NUM(lambda: number)
    cpu_threads(8, runner, thread_num)
    for a, b in zip(want, sequence_results()):
        assert torch.equal(a, b)
    assert torch.equal(pyroundlib.round_ste(x), torch.round(x))


@pytest.mark.parametrize("runner", RUNNERS[:2])
def test_sequence_callers_share_the_threads(cpu_threads, runner):
    """8 Python threads in the CPU loop at once (with the library's workers, one call holds
    them and the others run alone; with OpenMP, each thread leads a team of its own):
    every result is the one a lone call gives."""
    given = (None, None) if runner == "own workers" else _threads.openmp_runtime()
    if runner == "OpenMP runtime" and not given[0]:
        pytest.skip("no OpenMP runtime found")
    cpu_threads(1, *given)
    want = [sequence_results(seed=k, batch=20 + k) for k in range(THREADS)]
    cpu_threads(4, *given)

    def target(k):
        for _ in range(10):
            for a, b in zip(want[k], sequence_results(seed=k, batch=20 + k)):
                assert torch.equal(a, b)

    run_threads(target)


@pytest.mark.parametrize("runner", RUNNERS[:2])
def test_sequence_threads_after_fork(runner):
    """A child forked after the parent's threads started (the library's workers, or an
    OpenMP team) has none of them: it starts workers of its own and neither process hangs
    (an alarm ends either after a minute; the child sets its own, alarms are not inherited).
    torch's own ops run on one thread in both: an OpenMP runtime cannot be used in a child
    forked after it started a team, whoever's library is loaded."""
    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    if runner == "OpenMP runtime" and not _threads.openmp_parallel():
        pytest.skip("no OpenMP runtime found")
    run_python_ok(
        "import os, signal, torch, pyroundlib\n"
        "signal.alarm(60)\n"
        "torch.set_num_threads(1)\n"
        "lib = pyroundlib._ffi.library()\n"
        f"lib.prl_set_cpu_parallel({'None' if runner == 'own workers' else 'pyroundlib._threads.openmp_parallel()'})\n"
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


def packed_layer_results(batch, state, dtype):
    """A 2-layer bidirectional LLTMLayer over a pack of `batch` sequences of lengths 1-9
    (unsorted): [output data, h_n, c_n, and the gradients of the input and every parameter],
    and the layer, input and lengths."""
    gen = torch.Generator().manual_seed(batch * 1000 + state)
    layer = pyroundlib.LLTMLayer(5, state, num_layers=2, bidirectional=True, dtype=dtype)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.rand(p.shape, generator=gen) * 2 / state ** 0.5 - 1 / state ** 0.5)
    lengths = torch.randint(1, 10, (batch,), generator=gen)
    lengths[batch // 2] = 9
    x = torch.randn(9, batch, 5, generator=gen).to(dtype).requires_grad_()
    output, (h, c) = layer(torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False))
    weights = [torch.randn(t.shape, generator=gen).to(dtype) for t in (output.data, h, c)]
    grads = torch.autograd.grad([output.data, h, c], [x, *layer.parameters()], weights)
    return [output.data, h, c, *grads], layer, x, lengths


@pytest.mark.parametrize("split", list(SPLITS))
def test_packed_loop_split_among_threads(cpu_threads, split):
    """A pack through the library's packed loop (each step the rows still running): right
    against each sequence run alone by the float64 reference, and bit for bit the same at any
    thread count, split by rows, by rows and state columns, or with torch's BLAS."""
    from test_layer import packed_reference
    lib = _ffi.library()
    steps, batch, state, own = SPLITS[split]
    gemm = (None, None) if own else _threads.blas_gemm(any_cpu=True)
    if not own and not gemm[0]:
        pytest.skip("torch exports no BLAS (test_blas_is_found says where one must be)")
    lib.prl_set_cpu_gemm(*gemm)  # the fixture hands back what pyroundlib gave
    for threads in (1, 3):
        cpu_threads(threads)
        got, layer, x, lengths = packed_layer_results(batch, state, torch.float64)
        output, h, c = packed_reference(layer, x, lengths.tolist())
        packed = torch.nn.utils.rnn.pack_padded_sequence(output, lengths, enforce_sorted=False)
        torch.testing.assert_close(got[:3], [packed.data, h, c])
    for dtype in (torch.float32, torch.bfloat16):
        cpu_threads(1)
        alone = packed_layer_results(batch, state, dtype)[0]
        for threads in (2, 5, 16):
            cpu_threads(threads)
            for k, (a, b) in enumerate(zip(alone, packed_layer_results(batch, state, dtype)[0])):
                assert torch.equal(a, b), (dtype, threads, k)
