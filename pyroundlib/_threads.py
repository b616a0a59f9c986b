"""The library's CPU threads follow torch's intra-op threads, and its products torch's BLAS.

The CPU kernels split their work among threads (the elementwise kernels chunks of their
arrays, the sequence loops their cells).  They use as many as torch's intra-op pool has
(torch.set_num_threads; 1 in a DataLoader worker), and, where torch runs that pool on
OpenMP, the very same threads: the library is handed
GOMP_parallel, the fork-join entry point of the OpenMP runtime already loaded with torch
(libgomp, or LLVM's or Intel's runtime, which export it too), and its omp_get_thread_num, so
that thread m of a region takes the m-th range as in torch's own parallel_for.  Those threads are usually
still spinning from torch's last op; a second set of threads would compete with them for
the cores.  Where no runtime is found (torch without OpenMP, no /proc/self/maps to find it
by), the loop stays on the calling thread: the library's own workers would compete with
torch's spinning threads in the same way (measured on a 16-core Xeon: after a torch GEMM,
16 of them took the (8, 32, 8, 64) forward from 272 to 352 us, torch's 16 OpenMP threads
to 111 us).  They remain for C callers (prl_set_cpu_threads without prl_set_cpu_parallel).

The sequence loop multiplies small batches (at most 4 rows) with the BLAS torch's CPU GEMMs
use, where one exports the standard sgemm_/dgemm_ (torch's x86-64 wheels: MKL, inside
libtorch_cpu) and the CPU is Intel's; everything else with the library's own register-tiled
product (PYROUNDLIB_CPU_BLAS=0: always).  Likewise a large input half and the gradient
products of all steps: torch's GEMMs on Intel CPUs, the library's product, split among the same
threads, on other x86 CPUs with AVX-512 (torch_gemms_first).
"""
from __future__ import annotations

import ctypes
import functools
import os
import re
import sys
from typing import Optional, Tuple

import torch

from . import _ffi

_OPENMP_RUNTIME = re.compile(r"lib(g|i)?omp\d*([-.][\w.-]*)?\.so")
_BLAS = re.compile(r"lib(torch_cpu|mkl_rt|openblas\w*|blas)([-.][\w.-]*)?\.so")
BLAS_ENV_VAR = "PYROUNDLIB_CPU_BLAS"  # "0": never torch's BLAS; "1": on any CPU, not only Intel's
# torch's thread count last seen, and what the library was given (parallel, thread_num, gemm None: not yet
# looked for)
_given = {"torch": 1, "threads": 1, "parallel": None, "thread_num": None, "gemm": None}


def loaded_libraries(pattern) -> list:
    """Paths of the shared libraries in this process whose file name matches pattern, those
    inside torch's package first."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {fields[5].strip() for fields in (line.split(None, 5) for line in maps) if len(fields) == 6}
    except OSError:
        return []
    return sorted((path for path in paths if pattern.match(os.path.basename(path))), key=_torch_first)


def _torch_first(path: str):
    return not path.startswith(os.path.dirname(torch.__file__) + os.sep), path


def symbol_address(path: str, symbol: str) -> Optional[int]:
    """symbol's address in the library at path, already loaded (RTLD_NOLOAD), or None."""
    try:
        library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        return ctypes.cast(getattr(library, symbol), ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None


def openmp_parallel() -> Optional[int]:
    """The address of GOMP_parallel in the OpenMP runtime torch's intra-op threads belong
    to, or None."""
    return openmp_runtime()[0]


def openmp_runtime() -> Tuple[Optional[int], Optional[int]]:
    """The addresses of GOMP_parallel and omp_get_thread_num (None if not exported) in the
    OpenMP runtime torch's intra-op threads belong to, or Nones.  Only runtimes already
    loaded into the process are considered (RTLD_NOLOAD); of several, the one inside torch's
    package comes first, then libgomp."""
    if not torch.backends.openmp.is_available() or not hasattr(os, "RTLD_NOLOAD"):
        return None, None
    runtimes = sorted(loaded_libraries(_OPENMP_RUNTIME),
                      key=lambda path: (_torch_first(path)[0], "gomp" not in path, path))
    for path in runtimes:
        address = symbol_address(path, "GOMP_parallel")
        if address:
            return address, symbol_address(path, "omp_get_thread_num")
    return None, None


def blas_gemm(any_cpu: bool = False) -> Tuple[Optional[int], Optional[int]]:
    """The addresses of sgemm_ and dgemm_ of the BLAS torch's CPU GEMMs run on, or Nones:
    those exported by a library already loaded (torch's own first: the x86-64 wheels link
    MKL into libtorch_cpu and export its BLAS interface; else an MKL or OpenBLAS torch
    loaded).  Handed over on Intel CPUs only, where MKL's small products pay (on an AMD EPYC
    they took up to 2.3x the library's own: native/src/lltm_sequence_cpu.cpp, Plan), unless
    any_cpu or PYROUNDLIB_CPU_BLAS=1.  None on a big-endian host (prl_set_cpu_gemm) and with
    PYROUNDLIB_CPU_BLAS=0."""
    choice = os.environ.get(BLAS_ENV_VAR, "")
    if choice == "0" or sys.byteorder != "little" or not hasattr(os, "RTLD_NOLOAD"):
        return None, None
    if not (any_cpu or choice == "1" or _intel_cpu()):
        return None, None
    for path in loaded_libraries(_BLAS):
        sgemm, dgemm = symbol_address(path, "sgemm_"), symbol_address(path, "dgemm_")
        if sgemm and dgemm:
            return sgemm, dgemm
    return None, None


def torch_gemms_first() -> bool:
    """Whether a product both torch's CPU GEMM and the library's can run (a sequence's input
    half, its gradient products of all steps) goes to torch's: yes on Intel CPUs, whose MKL is
    the faster there, and on CPUs without AVX-512 (the library's 3-row tiles there have not been
    measured against their BLAS); no on other x86 CPUs with AVX-512, where MKL took 1.1-2.1x the
    library's time from 32 columns on (an AMD EPYC, Zen 5, torch 2.13.0: benchmarks/NOTES.md).
    PYROUNDLIB_CPU_BLAS=1: yes on any CPU; =0: never."""
    choice = os.environ.get(BLAS_ENV_VAR, "")
    if choice in ("0", "1"):
        return choice == "1"
    return _intel_cpu() or "avx512f" not in _cpu_flags()


@functools.lru_cache(maxsize=None)
def _cpu_info() -> dict:
    """The first CPU's fields in /proc/cpuinfo (x86 Linux: vendor_id, flags, ...), else empty."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                key, colon, value = line.partition(":")
                if not key.strip():
                    break  # the first CPU's block ends at a blank line
                if colon:
                    fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def _intel_cpu() -> bool:
    return _cpu_info().get("vendor_id") == "GenuineIntel"


def _cpu_flags() -> frozenset:
    """The first CPU's feature flags (x86 Linux), else empty."""
    return frozenset(_cpu_info().get("flags", "").split())


def follow_torch() -> None:
    """Gives the library torch's thread count and, on first need, its OpenMP runtime (one
    thread where there is no runtime to share) and its BLAS."""
    threads = torch.get_num_threads()
    if threads == _given["torch"] and _given["gemm"] is not None:
        return
    library = _ffi.library()
    if _given["gemm"] is None:
        _given["gemm"] = blas_gemm()
        library.prl_set_cpu_gemm(*_given["gemm"])
        if threads == _given["torch"]:
            return
    if threads > 1 and _given["parallel"] is None:
        parallel, thread_num = openmp_runtime()
        _given["parallel"], _given["thread_num"] = parallel or 0, (parallel and thread_num) or 0
        library.prl_set_cpu_parallel(_given["parallel"] or None)
        library.prl_set_cpu_thread_num(_given["thread_num"] or None)
    usable = threads if _given["parallel"] else 1
    if usable != _given["threads"]:
        library.prl_set_cpu_threads(usable)
        _given["threads"] = usable
    _given["torch"] = threads
