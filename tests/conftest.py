import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pyroundlib

# The folder that holds the pyroundlib package under test: the source tree, or site-packages
# when the suite runs against an installed wheel (make test-installed).
PACKAGE_PARENT = Path(pyroundlib.__file__).resolve().parent.parent

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
CUDA = torch.cuda.is_available() and pyroundlib.library_info()["cuda"]
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])

requires_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build of the library")
requires_two_gpus = pytest.mark.skipif(not CUDA or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")

# Tolerances for LLTM against the plain-PyTorch reference computed in the same dtype
# (the GEMMs are identical; the pointwise math here runs in float for 16-bit types).
TOLERANCES = {
    torch.float64: dict(rtol=1e-10, atol=1e-12),
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=1e-2, atol=1e-2),
    torch.bfloat16: dict(rtol=5e-2, atol=5e-2),
}


def pytest_collection_modifyitems(config, items):
    """PYROUNDLIB_TEST_SHARDS=N and PYROUNDLIB_TEST_SHARD=k (0 <= k < N): only the k-th of N
    shards of the collected tests (test i where i % N == k), so that N processes run the suite
    side by side (`make test SHARDS=N`: the whole suite on one GPU in minutes, docs/design.md)."""
    shards = os.environ.get("PYROUNDLIB_TEST_SHARDS", "")
    if shards in ("", "1"):
        return
    shard = os.environ.get("PYROUNDLIB_TEST_SHARD", "")
    if not (shards.isdigit() and shard.isdigit() and int(shard) < int(shards)):
        raise pytest.UsageError(f"PYROUNDLIB_TEST_SHARDS ({shards!r}) and PYROUNDLIB_TEST_SHARD ({shard!r}) "
                                "must be N >= 1 and 0 <= k < N")
    keep = [i % int(shards) == int(shard) for i in range(len(items))]
    config.hook.pytest_deselected(items=[item for item, kept in zip(items, keep) if not kept])
    items[:] = [item for item, kept in zip(items, keep) if kept]


def subprocess_env(**extra) -> dict:
    """The environment for a child Python that must import the same pyroundlib as the tests."""
    path = os.pathsep.join(p for p in (str(PACKAGE_PARENT), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, **extra)


def run_python_ok(code: str, **env):
    """Run ``code`` in a fresh Python on the same pyroundlib; it must exit 0 and print OK."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=subprocess_env(**env), timeout=600)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout + proc.stderr


def make_args(batch, features, state, dtype, device, requires_grad=True, scale=1.0):
    """Fresh random LLTM arguments (input, weights, bias, old_h, old_cell), drawn in float64."""
    shapes = [(batch, features), (3 * state, state + features), (3 * state,), (batch, state), (batch, state)]
    return [(torch.randn(s, dtype=torch.float64) * scale).to(dtype=dtype, device=device).requires_grad_(requires_grad)
            for s in shapes]


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


@pytest.fixture(params=DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def dtype(request):
    return request.param


@pytest.fixture(autouse=True)
def _subnormals_kept():
    """Each test starts with subnormal floats kept (IEEE), whatever ran before: on torch 2.4,
    the first torch.compile on the CPU loads code built with -ffast-math, which turns on
    flush-to-zero for the thread, and hypothesis refuses to draw floats then."""
    torch.set_flush_denormal(False)
    yield


@pytest.fixture(autouse=True)
def _matmul_tf32_restored():
    """A test may set torch.backends.cuda.matmul.allow_tf32 (float32 products on tensor cores
    or not): it is put back after each test.  Not with monkeypatch: the flag is computed by
    its module object, and recent pytest then deletes the attribute on undo, which fails."""
    allowed = torch.backends.cuda.matmul.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32 = allowed


@pytest.fixture(autouse=True)
def _fresh_seed():
    """Fresh data every run, reproducible from the seed a failing test's captured output shows."""
    seed = torch.seed() % 2**31
    print(f"torch.manual_seed({seed})")
    torch.manual_seed(seed)
    yield


def capture_after_warm_up(call):
    """Run ``call`` twice on a side stream (the warm-up ``torch.cuda.graph`` asks for), then
    capture it into a new CUDA graph: ``(graph, what the captured call returned)``."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = call()
    return graph, result
