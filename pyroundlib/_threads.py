"""The library's CPU threads follow torch's intra-op threads.

The CPU sequence loop (prl_lltm_sequence_*_cpu) splits its batch among threads.  It uses
as many as torch's intra-op pool has (torch.set_num_threads; 1 in a DataLoader worker),
and, where torch runs that pool on OpenMP, the very same threads: the library is handed
GOMP_parallel, the fork-join entry point of the OpenMP runtime already loaded with torch
(libgomp, or LLVM's or Intel's runtime, which export it too).  Those threads are usually
still spinning from torch's last op; a second set of threads would compete with them for
the cores.  Where no runtime is found (torch without OpenMP, no /proc/self/maps to find it
by), the loop stays on the calling thread: the library's own workers would compete with
torch's spinning threads in the same way (measured on a 16-core Xeon: after a torch GEMM,
16 of them took the (8, 32, 8, 64) forward from 272 to 352 us, torch's 16 OpenMP threads
to 111 us).  They remain for C callers (prl_set_cpu_threads without prl_set_cpu_parallel).
"""
from __future__ import annotations

import ctypes
import os
import re
from typing import Optional

import torch

from . import _ffi

_OPENMP_RUNTIME = re.compile(r"lib(g|i)?omp\d*([-.][\w.-]*)?\.so")
# torch's thread count last seen, and what the library was given (parallel None: not yet looked for)
_given = {"torch": 1, "threads": 1, "parallel": None}


def openmp_parallel() -> Optional[int]:
    """The address of GOMP_parallel in the OpenMP runtime torch's intra-op threads belong
    to, or None.  Only runtimes already loaded into the process are considered
    (RTLD_NOLOAD); of several, the one inside torch's package comes first, then libgomp."""
    if not torch.backends.openmp.is_available() or not hasattr(os, "RTLD_NOLOAD"):
        return None
    try:
        with open("/proc/self/maps") as maps:
            paths = {fields[5] for fields in (line.split(None, 5) for line in maps) if len(fields) == 6}
    except OSError:
        return None
    torch_dir = os.path.dirname(torch.__file__) + os.sep
    runtimes = sorted((path.strip() for path in paths if _OPENMP_RUNTIME.match(os.path.basename(path.strip()))),
                      key=lambda path: (not path.startswith(torch_dir), "gomp" not in path, path))
    for path in runtimes:
        try:
            runtime = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            return ctypes.cast(runtime.GOMP_parallel, ctypes.c_void_p).value
        except (OSError, AttributeError):
            continue
    return None


def follow_torch() -> None:
    """Gives the library torch's thread count and, on first need, its OpenMP runtime; one
    thread where there is no runtime to share."""
    threads = torch.get_num_threads()
    if threads == _given["torch"]:
        return
    library = _ffi.library()
    if threads > 1 and _given["parallel"] is None:
        _given["parallel"] = openmp_parallel() or 0
        library.prl_set_cpu_parallel(_given["parallel"] or None)
    usable = threads if _given["parallel"] else 1
    if usable != _given["threads"]:
        library.prl_set_cpu_threads(usable)
        _given["threads"] = usable
    _given["torch"] = threads
