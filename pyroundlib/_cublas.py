"""torch's cuBLAS for the library's own step loops: the library links no cuBLAS (one build for
every torch), but a CUDA torch has one loaded, and its handles at hand through public API.

A pack's step loop (``_packed.py``, where the persistent kernels do not hold the sizes) runs in
the library, each step's product by ``cublasGemmStridedBatchedEx`` of the cuBLAS loaded in this
process (found by name among the process's libraries, RTLD_NOLOAD, as ``_threads`` finds torch's
BLAS) on torch's handle for the device and stream (``torch.cuda.current_blas_handle()``, which
torch points at the current stream and its workspace).  Without either, or with
``PYROUNDLIB_CUBLAS=0``, or where torch's matmul settings ask what the library does not pass on
(reduced-precision reductions turned off), the loop runs from Python over torch's GEMMs.
"""
from __future__ import annotations

import os
import re
from typing import Optional, Tuple

import torch

from . import _threads

ENV_VAR = "PYROUNDLIB_CUBLAS"
_CUBLAS = re.compile(r"libcublas\.so(\.\d+)*$")  # not libcublasLt
_found: dict = {}  # "gemm": the address, or None once looked for


def _gemm() -> Optional[int]:
    """The address of cublasGemmStridedBatchedEx in a cuBLAS already loaded, or None."""
    if "gemm" not in _found:
        address = None
        if hasattr(os, "RTLD_NOLOAD"):
            address = next(filter(None, (_threads.symbol_address(path, "cublasGemmStridedBatchedEx")
                                         for path in _threads.loaded_libraries(_CUBLAS))), None)
        _found["gemm"] = address
    return _found["gemm"]


def _settings_passed_on(dtype: torch.dtype) -> bool:
    """Whether the library's product honours torch's matmul settings for dtype: TF32 for
    float32 is passed on; turned-off reduced-precision reductions in 16 bits are not."""
    matmul = torch.backends.cuda.matmul
    if dtype == torch.float16:
        return matmul.allow_fp16_reduced_precision_reduction
    if dtype == torch.bfloat16:
        return matmul.allow_bf16_reduced_precision_reduction
    return True


def for_tensor(t: torch.Tensor) -> Optional[Tuple[int, int, int]]:
    """(gemm, handle, tf32): the library's product for t's device and current stream, or None
    (the loop then runs from Python)."""
    if not t.is_cuda or os.environ.get(ENV_VAR, "") == "0" or not _settings_passed_on(t.dtype):
        return None
    index = t.get_device()
    if index == torch.cuda.current_device():
        handle = torch.cuda.current_blas_handle()  # initialises cuBLAS (so loads it) if no GEMM has yet
    else:
        with torch.cuda.device(index):
            handle = torch.cuda.current_blas_handle()
    gemm = _gemm()
    if gemm is None or not handle:
        return None
    return gemm, handle, int(t.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32)
