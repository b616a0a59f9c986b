"""What both ops share: dtype codes, argument checks, and the launch on the tensor's device."""
from __future__ import annotations

import torch

from . import _ffi

# torch dtype -> prl_dtype code (native/include/pyroundlib.h)
DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}
SUPPORTED_DEVICES = ("cpu", "cuda")

try:  # ~0.2 us, against ~5 us for torch.cuda.current_stream(i).cuda_stream
    _raw_stream = torch._C._cuda_getCurrentRawStream
except AttributeError:  # pragma: no cover - older or CPU-only torch builds
    def _raw_stream(index: int) -> int:
        return torch.cuda.current_stream(index).cuda_stream


def check_tensor(name: str, value) -> None:
    """A floating tensor of a supported dtype, on a supported device."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in DTYPE_CODES:
        raise TypeError(f"{name} must have dtype float32, float64, float16 or bfloat16, got {value.dtype}")
    if not (value.is_cuda or value.is_cpu or value.is_meta):
        raise ValueError(f"{name} is on device {value.device}; pyroundlib runs on CPU and CUDA tensors")


def check_like(name: str, value: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    """``value`` is a valid tensor with the dtype and device of ``ref``."""
    check_tensor(name, value)
    if value.dtype != ref.dtype:
        raise TypeError(f"{name} has dtype {value.dtype} but {ref_name} has dtype {ref.dtype}; all inputs must "
                        "share one dtype")
    if value.device != ref.device:
        raise ValueError(f"{name} is on {value.device} but {ref_name} is on {ref.device}; all inputs must be on "
                         "one device")


def check_shape(name: str, value: torch.Tensor, expected: tuple, meaning: str) -> None:
    if tuple(value.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {list(expected)}, got {list(value.shape)}: {meaning}")


class Kernel:
    """The CPU and CUDA entry points of one op, bound to the library on first call.

    ``kernel(t, *args)`` calls ``prl_<name>_cpu(*args)`` or, for a CUDA tensor ``t``,
    ``prl_<name>_cuda(*args, device_index, stream)`` with the current stream of ``t``'s
    own device; the library makes that device current around the launch.  A non-zero
    status raises.  The CPU call releases the GIL while the kernel computes; the CUDA
    call, which only enqueues a launch, keeps it (``Library.entry``).
    """

    __slots__ = ("name", "_lib", "_cpu", "_cuda")

    def __init__(self, name: str):
        self.name = name
        self._lib = self._cpu = self._cuda = None

    def _bind(self):
        lib = _ffi.library()
        self._cpu = lib.entry(f"prl_{self.name}_cpu")
        self._cuda = lib.entry(f"prl_{self.name}_cuda", keep_gil=True)
        self._lib = lib

    def __call__(self, t: torch.Tensor, *args) -> None:
        if self._lib is None:
            self._bind()
        if t.is_cuda:
            index = t.get_device()
            status = self._cuda(*args, index, _raw_stream(index))
        elif t.is_cpu:
            status = self._cpu(*args)
        else:
            raise ValueError(f"pyroundlib has no {self.name} kernel for device {t.device}")
        if status:
            self._lib.raise_status(status)


_dispatch_stack_len = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)
_is_compiling = torch.compiler.is_compiling
_functorch_active = torch._C._are_functorch_transforms_active
_is_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


def c_apply(function: type[torch.autograd.Function]):
    """``function.apply`` without its Python prologue: the C++ ``apply`` bound to ``function``.

    ``Function.apply`` is a Python classmethod that, before calling the C++ apply, binds the
    arguments of Functions written with ``setup_context``, unwraps dead functorch wrappers
    and hands functorch transforms their own path.  For a Function written in the classic
    ``forward(ctx, ...)`` form, called when ``plain_eager`` holds, none of that has
    anything to do, and skipping it saves a few us a call: 3-4% of an LLTM forward+backward
    at the benchmark's small sizes on the H100 machine (benchmarks/NOTES.md).  The prologue
    described is torch 2.13's (read from its source); tests/test_apply.py checks that both
    routes agree, and the GPU suite ran them on torch 2.11.  Falls back to
    ``function.apply`` on a torch whose classes are laid out differently."""
    try:
        return torch._C._FunctionBase.__dict__["apply"].__get__(None, function)
    except (AttributeError, KeyError, TypeError):  # pragma: no cover - other torch versions
        return function.apply


_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def plain_eager(*tensors: torch.Tensor | None) -> bool:
    """True when an op may take pyroundlib's eager fast path: call its kernels directly,
    skipping the torch.library dispatcher (~10 us a call), and apply its autograd Function
    through the C++ apply (``c_apply``), skipping ``Function.apply``'s Python prologue.

    That holds in plain eager mode: Dynamo is not tracing (it recognises ``Function.apply``
    and the custom ops, not ctypes calls), no functorch transform and no dispatch mode is
    active, and every tensor given is a plain ``torch.Tensor`` or ``nn.Parameter`` (not a
    FakeTensor, FunctionalTensor or other subclass that tracing uses) and not a functorch
    wrapper (``Function.apply`` unwraps dead ones).  ``None`` arguments are skipped.
    Otherwise the call goes through ``Function.apply`` and the registered custom ops."""
    if _is_compiling() or _functorch_active() or _dispatch_stack_len():
        return False
    for t in tensors:
        if t is not None and (type(t) not in _PLAIN_TYPES or _is_functorch_wrapped(t)):
            return False
    return True


def ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()
