"""The ctypes binding: one table of C signatures, and the library loader.

Every function of ``native/include/pyroundlib.h`` is declared once in
``_SIGNATURES``; the loader binds the table on first use (lazily, under a lock) and
turns every non-zero status into an exception (``pyroundlib.errors``).  Declaring
``argtypes`` matters: without it ctypes would pass a 64-bit stream handle or size
as a 32-bit C int.
"""
from __future__ import annotations

import ctypes
import os
import struct
import sys
import threading
from ctypes import c_char_p, c_int, c_int64, c_void_p
from pathlib import Path

from .errors import STATUS_ERRORS, LibraryLoadError, PyRoundLibError

ABI_VERSION = 15  # must equal PRL_ABI_VERSION of the library loaded
ENV_VAR = "PYROUNDLIB_LIBRARY"


def library_file(platform: str) -> str:
    """The library's file name on `platform` (a ``sys.platform`` value), as CMake names it."""
    return {"win32": "pyroundlib.dll", "darwin": "libpyroundlib.dylib"}.get(platform, "libpyroundlib.so")


LIBRARY_FILE = library_file(sys.platform)

STATUS = "status"  # marks a function returning prl_status: non-zero raises

_P = c_void_p  # any pointer, and the CUDA stream handle (cudaStream_t)
_I64 = c_int64
_INT = c_int

# name                       restype   argtypes
_SIGNATURES: tuple[tuple[str, object, tuple], ...] = (
    ("prl_abi_version",        _INT,     ()),
    ("prl_has_cuda",           _INT,     ()),
    ("prl_cuda_architectures", c_char_p, ()),
    ("prl_status_string",      c_char_p, (_INT,)),
    ("prl_last_error",         c_char_p, ()),
    #                                    x   y   n     dtype [device stream]
    ("prl_round_cpu",          STATUS,   (_P, _P, _I64, _INT)),
    ("prl_round_cuda",         STATUS,   (_P, _P, _I64, _INT, _INT, _P)),
    #                                    gates old_cell new_h new_cell batch state dtype [device stream]
    ("prl_lltm_forward_cpu",   STATUS,   (_P, _P, _P, _P, _I64, _I64, _INT)),
    ("prl_lltm_forward_cuda",  STATUS,   (_P, _P, _P, _P, _I64, _I64, _INT, _INT, _P)),
    #                                    grad_h grad_cell gates old_cell d_gates d_old_cell d_bias batch state dtype
    ("prl_lltm_backward_cpu",  STATUS,   (_P, _P, _P, _P, _P, _P, _P, _I64, _I64, _INT)),
    ("prl_lltm_backward_cuda", STATUS,   (_P, _P, _P, _P, _P, _P, _P, _I64, _I64, _INT, _INT, _P)),
    #                                          grad_h grad_h_parts parts grad_cell gates old_cell d_gates d_old_cell
    #                                          batch state dtype [device stream]
    ("prl_lltm_backward_parts_cpu",  STATUS, (_P, _P, _I64, _P, _P, _P, _P, _P, _I64, _I64, _INT)),
    ("prl_lltm_backward_parts_cuda", STATUS, (_P, _P, _I64, _P, _P, _P, _P, _P, _I64, _I64, _INT, _INT, _P)),
    ("prl_set_cpu_threads",    STATUS,   (_I64,)),
    ("prl_cpu_threads",        _I64,     ()),
    ("prl_set_cpu_parallel",   STATUS,   (_P,)),  # a prl_parallel_fn (GOMP_parallel's address) or NULL
    ("prl_set_cpu_thread_num", STATUS,   (_P,)),  # a prl_thread_num_fn (omp_get_thread_num's address) or NULL
    ("prl_set_cpu_gemm",       STATUS,   (_P, _P)),  # sgemm_ and dgemm_ addresses, or NULL
    #                                             batch state dtype device fits (int *)
    ("prl_lltm_sequence_cuda_fits",     STATUS, (_I64, _I64, _INT, _INT, _P)),
    #                                             gates w_h ldw h0 c0 output cells c_n steps batch state dtype [device stream]
    ("prl_lltm_sequence_forward_cpu",   STATUS, (_P, _P, _I64, _P, _P, _P, _P, _P, _I64, _I64, _I64, _INT)),
    ("prl_lltm_sequence_forward_cuda",  STATUS, (_P, _P, _I64, _P, _P, _P, _P, _P, _I64, _I64, _I64, _INT, _INT, _P)),
    #                                             grad_output grad_c_n gates w_h ldw c0 cells d_gates d_h0 d_c0
    #                                             steps batch state dtype [device stream]
    ("prl_lltm_sequence_backward_cpu",  STATUS, (_P, _P, _P, _P, _I64, _P, _P, _P, _P, _P, _I64, _I64, _I64, _INT)),
    #                                             input weights bias gates rows features state dtype
    ("prl_lltm_input_half_cpu",         STATUS, (_P, _P, _P, _P, _I64, _I64, _I64, _INT)),
    #                                             a lda transpose_a b ldb c ldc m n k dtype
    ("prl_matmul_cpu",                  STATUS, (_P, _I64, _INT, _P, _I64, _P, _I64, _I64, _I64, _I64, _INT)),
    #                                             the same with batch_sizes (an int64 array) before steps
    ("prl_lltm_sequence_packed_forward_cpu",  STATUS, (_P, _P, _I64, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64, _INT)),
    ("prl_lltm_sequence_packed_backward_cpu", STATUS, (_P, _P, _P, _P, _I64, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64,
                                                       _INT)),
    #                                             the same with device, stream (batch_sizes in device memory)
    ("prl_lltm_sequence_packed_forward_cuda",  STATUS, (_P, _P, _I64, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64, _INT,
                                                        _INT, _P)),
    ("prl_lltm_sequence_packed_backward_cuda", STATUS, (_P, _P, _P, _P, _I64, _P, _P, _P, _P, _P, _P, _I64, _I64,
                                                        _I64, _INT, _INT, _P)),
    #                                             dst src count device stream
    ("prl_upload_cuda",                 STATUS, (_P, _P, _I64, _INT, _P)),
    #                                             gemm handle tf32 gates w_h ldw w_stride h0 c0 output cells
    #                                             batch_sizes steps batch state directions dtype device stream
    ("prl_lltm_packed_steps_forward_cuda",  STATUS, (_P, _P, _INT, _P, _P, _I64, _I64, _P, _P, _P, _P, _P, _I64,
                                                     _I64, _I64, _I64, _INT, _INT, _P)),
    #                                             gemm handle tf32 grad_output gates w_h ldw w_stride c0 cells d_cell
    #                                             d_h d_gates d_h0 d_c0 batch_sizes steps batch state directions
    #                                             parts dtype device stream
    ("prl_lltm_packed_steps_backward_cuda", STATUS, (_P, _P, _INT, _P, _P, _P, _I64, _I64, _P, _P, _P, _P, _P, _P,
                                                     _P, _P, _I64, _I64, _I64, _I64, _I64, _INT, _INT, _P)),
    ("prl_lltm_sequence_backward_cuda", STATUS, (_P, _P, _P, _P, _I64, _P, _P, _P, _P, _P, _I64, _I64, _I64, _INT,
                                                 _INT, _P)),
    #                                             input weights bias h0 c0 output cells gates c_n
    #                                             steps batch features state dtype device stream
    ("prl_lltm_sequence_persistent_forward_cuda", STATUS, (_P, _P, _P, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64,
                                                           _I64, _INT, _INT, _P)),
    #                                                   batch features state dtype device fits (int *)
    ("prl_lltm_sequence_fused_cuda_fits",     STATUS, (_I64, _I64, _I64, _INT, _INT, _P)),
    #                                                   input weights bias h0 c0 output cells gates c_n
    #                                                   steps batch features state dtype device stream
    ("prl_lltm_sequence_fused_forward_cuda",  STATUS, (_P, _P, _P, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64, _I64,
                                                       _INT, _INT, _P)),
    #                                                   grad_output grad_c_n input weights h0 c0 output cells gates
    #                                                   d_gates d_input d_weights d_bias d_h0 d_c0
    #                                                   steps batch features state dtype device stream
    ("prl_lltm_sequence_fused_backward_cuda", STATUS, (_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P,
                                                       _I64, _I64, _I64, _I64, _INT, _INT, _P)),
    #                                                   input weights bias h0 c0 first lengths output cells
    #                                                   gates c_n steps batch rows features state dtype device
    #                                                   stream
    ("prl_lltm_packed_fused_forward_cuda",    STATUS, (_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64,
                                                       _I64, _I64, _INT, _INT, _P)),
    #                                                   grad_output grad_c_n input weights h0 c0 first lengths
    #                                                   output cells gates d_gates d_input d_weights d_bias d_h0
    #                                                   d_c0 steps batch rows features state dtype device stream
    ("prl_lltm_packed_fused_backward_cuda",   STATUS, (_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P,
                                                       _P, _P, _I64, _I64, _I64, _I64, _I64, _INT, _INT, _P)),
    #                                                   input weights bias weights_reverse bias_reverse h0 c0
    #                                                   first lengths order output h_n c_n directions steps
    #                                                   batch features state dtype device stream
    ("prl_lltm_layer_fused_inference_cuda",   STATUS, (_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _I64,
                                                       _I64, _I64, _I64, _I64, _INT, _INT, _P)),
)


class Library:
    """A loaded libpyroundlib: every function of the table is an attribute."""

    def __init__(self, path: str):
        self.path = path
        # CDLL: every call releases the GIL, so other Python threads run while a CPU
        # kernel computes.  PyDLL (the same loaded object) keeps it: see entry().
        self._dll = ctypes.CDLL(path)
        self._dll_keep_gil = ctypes.PyDLL(path)
        self._argtypes = {name: argtypes for name, _, argtypes in _SIGNATURES}
        self.abi_version = self._bind("prl_abi_version", _INT, ())()
        if self.abi_version != ABI_VERSION:
            raise LibraryLoadError(
                f"{path} has ABI version {self.abi_version}, but this pyroundlib needs ABI version "
                f"{ABI_VERSION}: rebuild the library with `make` (or point {ENV_VAR} at a matching build)")
        for name, restype, argtypes in _SIGNATURES:
            setattr(self, name, self._bind(name, restype, argtypes))
        self.has_cuda = bool(self.prl_has_cuda())
        archs = self.prl_cuda_architectures().decode()
        self.cuda_architectures = [a for a in archs.split(",") if a]

    def _bind(self, name, restype, argtypes):
        try:
            fn = getattr(self._dll, name)
        except AttributeError:
            raise LibraryLoadError(f"{self.path} does not export {name}: is it an older build? Rebuild with `make`")
        fn.argtypes = argtypes
        if restype is STATUS:
            fn.restype = c_int
            fn.errcheck = self._check_status
        else:
            fn.restype = restype
        return fn

    def _check_status(self, status, func, args):
        if status != 0:
            self.raise_status(status)
        return status

    def raise_status(self, status: int):
        """Raise the exception for a non-zero prl_status (message: this thread's last error)."""
        raise error_for_status(status, self.prl_status_string(status).decode(),
                               self.prl_last_error().decode(errors="replace"))

    def entry(self, name: str, keep_gil: bool = False):
        """A separate, lean binding of a status-returning function for the ops' hot path:
        it returns the status as an int (the caller checks it and calls raise_status), with
        no errcheck callback.  keep_gil=True calls it without releasing the GIL: right for
        the CUDA entry points, which only enqueue work (as torch's own ops do), so that a
        launch never waits to take the GIL back from another thread."""
        fn = (self._dll_keep_gil if keep_gil else self._dll)[name]
        fn.argtypes, fn.restype = self._argtypes[name], c_int
        return fn


def error_for_status(status: int, name: str, message: str) -> PyRoundLibError:
    cls = STATUS_ERRORS.get(status, PyRoundLibError)
    return cls(f"{name}: {message}", status=status, status_name=name)


def candidate_paths() -> list[str]:
    """Where the library (``library_file``: pyroundlib.dll on Windows) is looked for, in
    order: PYROUNDLIB_LIBRARY (when set, the only place); the package's folders (``pyroundlib.__path__``: the installed package, and for
    an editable install also the source folder); the source tree's build folder (`make`)."""
    override = os.environ.get(ENV_VAR)
    if override:
        return [override]
    name = library_file(sys.platform)
    package = sys.modules[__package__]
    folders = [Path(p) for p in getattr(package, "__path__", [Path(__file__).parent])]
    build = Path(__file__).resolve().parent.parent / "build"
    return [str(folder / name) for folder in folders] + [str(build / name)]


def check_elf_extents(path: str) -> None:
    """Refuse an ELF file shorter than its own headers say: dlopen() maps such a
    (truncated) file and the process dies of SIGBUS instead of getting an error."""
    with open(path, "rb") as f:
        header = f.read(64)
        size = os.fstat(f.fileno()).st_size
        if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            return  # not a 64-bit little-endian ELF file: dlopen() itself reports what is wrong
        (phoff, shoff), (phentsize, phnum, shentsize, shnum) = (struct.unpack_from("<QQ", header, 32),
                                                                 struct.unpack_from("<HHHH", header, 54))
        end = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
        if end <= size and phentsize >= 56:
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            for i in range(phnum):
                p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
                if p_type == 1:  # PT_LOAD
                    end = max(end, p_offset + p_filesz)
        if end > size:
            raise OSError(f"truncated ELF file: {size} bytes, but its headers describe {end} bytes")


def load_library() -> Library:
    # Windows: Python 3.8+ looks for a DLL's dependencies in its own folder and the system
    # folders, not on PATH (os.add_dll_directory adds more).  pyroundlib.dll needs nothing
    # more: it imports only system DLLs (MinGW's runtime is linked in; `make windows` checks).
    tried = []
    for path in candidate_paths():
        if not os.path.exists(path):
            tried.append(f"  {path}: no such file")
            continue
        try:
            check_elf_extents(path)
            return Library(path)
        except LibraryLoadError:
            raise
        except OSError as e:
            tried.append(f"  {path}: {e}")
    raise LibraryLoadError(
        "could not load the pyroundlib native library. Tried:\n" + "\n".join(tried) +
        f"\nBuild it with `make` in the pyroundlib source tree, or set {ENV_VAR} to the path of "
        f"{library_file(sys.platform)}.")


_lock = threading.Lock()
_library: Library | None = None


def library() -> Library:
    """The loaded library (loaded on first call; thread-safe)."""
    global _library
    lib = _library
    if lib is None:
        with _lock:
            if _library is None:
                _library = load_library()
            lib = _library
    return lib


def library_info() -> dict:
    """Path, ABI version and CUDA support of the loaded native library (loading it if needed)."""
    lib = library()
    return {
        "path": lib.path,
        "abi_version": lib.abi_version,
        "cuda": lib.has_cuda,
        "cuda_architectures": list(lib.cuda_architectures),
    }
