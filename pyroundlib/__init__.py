"""pyroundlib: custom CPU/CUDA kernels behind a plain C ABI, used as PyTorch ops.

    import torch, pyroundlib
    bits = pyroundlib.RoundSTE()(torch.sigmoid(logits))      # binarise, straight-through gradient
    cell = pyroundlib.LLTM(input_features=32, state_size=128)
    h, c = cell(x, (h, c))

The native library (libpyroundlib) is loaded on first use; see ``library_info()``.
"""
from __future__ import annotations

__version__ = "0.4.0"
# The torch versions this release supports: pyproject.toml's dependency, README's
# Compatibility section and `python -m pyroundlib` all state this range.
SUPPORTED_TORCH = ">=2.4"
MIN_TORCH = (2, 4)

from ._ffi import ABI_VERSION, library_info
from .errors import (CudaError, CudaNotCompiledError, InternalError, InvalidArgumentError, LibraryLoadError,
                     PyRoundLibError, UnsupportedDtypeError)
from .lltm import LLTM, LLTMFunction, LLTMPointwiseFunction, lltm_cell
from .round import RoundSTE, RoundSTEFunction, round_ste
from .layer import LLTMLayer
from .sequence import LLTMSequenceFunction, lltm_sequence

__all__ = [
    "__version__", "SUPPORTED_TORCH", "ABI_VERSION", "library_info",
    "round_ste", "RoundSTE", "RoundSTEFunction",
    "lltm_cell", "LLTM", "LLTMFunction", "LLTMPointwiseFunction",
    "lltm_sequence", "LLTMLayer", "LLTMSequenceFunction",
    "PyRoundLibError", "InvalidArgumentError", "UnsupportedDtypeError", "CudaError", "CudaNotCompiledError",
    "InternalError", "LibraryLoadError",
]
