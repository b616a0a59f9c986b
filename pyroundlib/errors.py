"""Exceptions raised by pyroundlib.

Every non-zero ``prl_status`` from the C library becomes an instance of a
:class:`PyRoundLibError` subclass carrying the status name and the library's
per-thread message (which argument, which CUDA error).  Classes also derive from
the matching built-in exception, so ``except ValueError`` catches a bad argument
whether Python or C caught it.
"""
from __future__ import annotations


class PyRoundLibError(RuntimeError):
    """Base class of pyroundlib's exceptions; ``status`` is the C status code (or None)."""

    status: int | None = None

    def __init__(self, message: str, status: int | None = None, status_name: str | None = None):
        super().__init__(message)
        self.status = status
        self.status_name = status_name


class InvalidArgumentError(PyRoundLibError, ValueError):
    """PRL_ERROR_INVALID_ARGUMENT: a null pointer, a negative or overflowing size."""


class UnsupportedDtypeError(PyRoundLibError, TypeError):
    """PRL_ERROR_UNSUPPORTED_DTYPE: a dtype code the library does not know."""


class CudaError(PyRoundLibError):
    """PRL_ERROR_CUDA: a CUDA runtime call or kernel launch failed."""


class CudaNotCompiledError(PyRoundLibError):
    """PRL_ERROR_CUDA_NOT_COMPILED: a CUDA tensor reached a CPU-only build of the library."""


class InternalError(PyRoundLibError):
    """PRL_ERROR_INTERNAL: an unexpected C++ exception, caught at the C boundary."""


class LibraryLoadError(PyRoundLibError, ImportError):
    """The shared library could not be found or loaded, or has another ABI version."""


STATUS_ERRORS: dict[int, type[PyRoundLibError]] = {
    1: InvalidArgumentError,
    2: UnsupportedDtypeError,
    3: CudaError,
    4: CudaNotCompiledError,
    5: InternalError,
}
