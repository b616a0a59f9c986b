"""What both ops share: dtype codes, argument checks, and the launch on the tensor's device."""
from __future__ import annotations

import inspect
import os

import torch
from torch.autograd import forward_ad

from . import _ffi, _threads

# torch dtype -> prl_dtype code (native/include/pyroundlib.h)
DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}


# The ops' namespace, defined with torch.library's low-level public API: a schema, one
# kernel registered for CPU and for CUDA, and a fake implementation for meta and fake
# tensors (torch.compile, export).  torch.library.custom_op builds on the same API and adds
# per-call Python wrappers (a torch.compile guard, an autograd shim); skipping them saves
# ~5 us per op call, 8.3 -> 3.3 us for round on 4096 floats (benchmarks/NOTES.md).
LIBRARY = torch.library.Library("pyroundlib", "DEF")


def define_op(schema: str, kernel, fake, backward=None, setup_context=None, eager_twin: bool = False) -> str:
    """Define ``pyroundlib::<schema>`` with ``kernel`` for CPU and CUDA tensors, ``fake`` for
    the rest and, when given, ``backward`` (+ ``setup_context``) as its autograd formula;
    returns the op's qualified name.  The ops are what torch.compile, export, TorchScript
    and opcheck see.

    ``eager_twin``: also define ``pyroundlib::<name>_no_autograd``, the same kernel and fake
    implementation without the formula, for an autograd Function's forward in eager mode.
    There the Function is the autograd node, and calling the differentiable op would run
    torch.library's autograd wrapper on every call for nothing: Python code that
    redispatches below autograd, a second round trip from the dispatcher into Python (~85
    us of a ~600 us small sequence call on the H100 machine; benchmarks/NOTES.md).  What
    torch.compile and export trace keeps the differentiable op, so an exported program
    records an op that can be trained.  Called directly with inputs that require grad under
    grad mode, the twin has no derivative (torch's autograd fallback warns on backward)."""
    name, signature = schema.split("(", 1)
    LIBRARY.define(schema)
    for device in ("CPU", "CUDA"):
        LIBRARY.impl(name, kernel, device)
    torch.library.register_fake(f"pyroundlib::{name}", fake, lib=LIBRARY)
    if backward is not None:
        torch.library.register_autograd(f"pyroundlib::{name}", backward, setup_context=setup_context, lib=LIBRARY)
    if eager_twin:
        define_op(f"{name}_no_autograd({signature}", kernel, fake)
    return f"pyroundlib::{name}"


def define_composite(schema: str, fn) -> str:
    """Define ``pyroundlib::<schema>`` as a composite of other ops (``fn``, in Python):
    autograd, meta tensors and tracing follow the ops it calls.  For TorchScript, which
    can call registered ops but not Python functions."""
    name = schema.split("(", 1)[0]
    LIBRARY.define(schema)
    LIBRARY.impl(name, fn, "CompositeImplicitAutograd")
    return f"pyroundlib::{name}"


class _BoundPositionally(inspect.BoundArguments):
    """What ``_PositionalSignature.bind`` returns: every parameter bound, positionally, none
    with a default, so ``args`` is ``arguments``' values in order, ``kwargs`` is empty and
    there are no defaults to apply (inspect's versions walk the parameters to find that)."""

    __slots__ = ()

    @property
    def args(self) -> tuple:
        return tuple(self.arguments.values())

    @property
    def kwargs(self) -> dict:
        return {}

    def apply_defaults(self) -> None:
        pass


class _PositionalSignature(inspect.Signature):
    """A signature of plain parameters (positional-or-keyword, no defaults) whose ``bind``
    takes a call passing all of them positionally in one step; any other call gets
    ``inspect.Signature.bind`` itself (its binding, its errors)."""

    __slots__ = ("_names",)

    def __init__(self, signature: inspect.Signature):
        super().__init__(list(signature.parameters.values()), return_annotation=signature.return_annotation)
        self._names = tuple(signature.parameters)

    def bind(self, *args, **kwargs) -> inspect.BoundArguments:
        if kwargs or len(args) != len(self._names):
            return super().bind(*args, **kwargs)
        return _BoundPositionally(self, dict(zip(self._names, args)))


def signature_once(function_class):
    """Class decorator: ``function_class.forward``'s signature computed once, not per call.
    ``Function.apply`` binds each call's arguments to ``forward``'s signature when the
    Function defines ``setup_context`` (as torch.func requires), with
    ``inspect.signature(forward).bind(...)``; ``inspect.signature`` returns a function's
    ``__signature__`` when it has one.  Computing it once took that from 36 to 11 us of host
    time a call on the development VM; a ``_PositionalSignature``, whose ``bind`` takes the
    usual all-positional call without inspect's general binding, from 11 to ~2 us
    (benchmarks/NOTES.md).  Subclasses inherit the same ``forward``."""
    forward = function_class.forward
    signature = inspect.signature(forward)
    plain = all(p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty for p in signature.parameters.values())
    forward.__signature__ = _PositionalSignature(signature) if plain else signature
    return function_class


def exporting() -> bool:
    """Whether torch.export (strict or not) is tracing: ``torch.compiler.is_exporting()``
    where this torch has it; before that (torch 2.4), non-strict export, which traces
    without Dynamo while ``is_compiling()`` is true (strict export is then taken for
    torch.compile)."""
    is_exporting = getattr(torch.compiler, "is_exporting", None)
    if is_exporting is not None:
        return is_exporting()
    return torch.compiler.is_compiling() and not torch.compiler.is_dynamo_compiling()


def has_tangent(tensors) -> bool:
    """Whether any of ``tensors`` carries a forward-mode tangent at the current level
    (``torch.func.jvp``, ``jacfwd``, ``torch.autograd.forward_ad``): the public
    ``forward_ad.unpack_dual``, ~0.3 us a tensor.

    The entry points then compute in differentiable torch ops instead of through their
    autograd Function.  A Function's ``jvp`` is right to first order, but torch loses the
    higher orders: nested forward mode (``jvp`` of ``jvp``, ``jacfwd(jacfwd(f))``) through
    any autograd.Function gives zero second-order tangents, silently
    (pytorch/pytorch#197867).  Torch's own forward-mode formulas compose to any order."""
    return any(forward_ad.unpack_dual(t).tangent is not None for t in tensors)


# Where torch.library.register_vmap exists (public from torch 2.4), an op called directly
# under vmap can have a batching rule of its own, and the entry points call their op's eager
# twin directly where no gradient is wanted (``no_gradient_wanted``); a torch without it keeps
# the autograd Function, whose ``vmap`` rule covers them.
DIRECT_WITHOUT_GRAD = hasattr(torch.library, "register_vmap")


def no_gradient_wanted(tensors) -> bool:
    """Whether an eager call wants no gradient: grad mode off (``no_grad``, inference mode) or
    none of ``tensors`` requiring grad (a non-tensor among them is left to the argument
    checks).  There an entry point skips its autograd Function's ``apply`` (binding, a node's
    context: host time of every call) and calls the op's eager twin.  Under torch.func.grad
    the inputs require grad at its level, so the Function runs; under torch.compile, export
    and ``jit.trace`` the answer is no (``function_for`` picks)."""
    return (not (torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors))
            and not torch.compiler.is_compiling() and not torch.jit.is_tracing())


def function_for(op, traced, eager):
    """What an entry point calls with its tensors:

    - in eager mode, ``eager.apply``: the autograd Function, with ``jvp`` and ``vmap``;
    - while torch.export or ``torch.jit.trace`` traces, the differentiable op ``op`` itself,
      recorded as one node with its registered autograd formula: strict export runs a
      Function's forward with grad mode off (torch 2.13: the program's outputs would not be
      differentiable), torch 2.4's non-strict export fails on a Function, and ``jit.trace``
      records a Function as a Python op that a saved trace cannot replay;
    - while torch.compile traces, ``traced.apply`` (on views of the tensors: ``_apply_traced``):
      the same Function without ``jvp``, which Dynamo refuses.  A Function, not the op:
      torch.func transforms inside compiled code (``grad``, ``vjp``, ``jacrev``) need a
      Function with ``setup_context``, which torch.library's autograd wrapper of an op is not
      (before torch 2.15: pytorch/pytorch#170834).

    Under torch.compile with grad mode off (inference) no autograd node is wanted either: the
    op too.  (torch 2.4's Dynamo inlines a ``setup_context`` Function's forward with a ``ctx``
    argument there, so strict export under ``no_grad`` failed; torch.func's transforms turn
    grad mode on inside, where the Function still runs.)

    Eager mode, the hot path, asks two questions (export implies ``is_compiling()``)."""
    if torch.compiler.is_compiling():
        if exporting() or not torch.is_grad_enabled() or not _KNOWS_EXPORT:
            return op
        return lambda *args: _apply_traced(traced, args)
    return op if torch.jit.is_tracing() else eager.apply


# Whether this torch tells strict export from torch.compile (torch.compiler.is_exporting, from
# torch 2.7).  Before it, torch.compile too records the op: torch 2.6's strict export applied
# the Function with grad mode off (an exported program that cannot be differentiated), and
# torch.func inside compiled code, what the Function is there for, failed on those torches anyway.
_KNOWS_EXPORT = hasattr(torch.compiler, "is_exporting")


def _apply_traced(function, args):
    """``function.apply`` as torch.compile traces it, on views of the tensors.  Dynamo applies a
    Function as an autograd node only where it knows an argument to require grad; else it runs
    the forward as plain code.  A torch.func transform's own inputs (``grad(f)(x)`` inside
    compiled code, ``f`` calling an entry point on ``x``) it takes for tensors that require no
    grad, so the forward's op met torch.func with torch.library's autograd wrapper, which torch
    before 2.15 rejects ("it must override the setup_context staticmethod"); a view is an op,
    whose result Dynamo knows to require grad.  A view costs nothing in the compiled graph."""
    return function.apply(*(t.view_as(t) if isinstance(t, torch.Tensor) else t for t in args))


# autocast casts these (not float64), as it does for the ops it runs in lower precision
AUTOCAST_ELIGIBLE = (torch.float32, torch.float16, torch.bfloat16)


def autocast_cast(tensors: tuple) -> tuple:
    """``tensors`` as autocast would hand them to an op on its lower-precision list (such
    as ``lstm_cell`` on CUDA): when autocast is on for the first tensor's device type,
    every float32/float16/bfloat16 tensor in the autocast dtype (a differentiable cast:
    float32 parameters get float32 gradients); else unchanged."""
    first = tensors[0]
    if not isinstance(first, torch.Tensor):
        return tensors
    device_type = "cuda" if first.is_cuda else "cpu" if first.is_cpu else None  # no torch.device object made
    if device_type is None or not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.dtype in AUTOCAST_ELIGIBLE
                 and t.device.type == device_type else t for t in tensors)


def public_stream_handle(index: int) -> int:
    """The raw ``cudaStream_t`` of device ``index``'s current stream, through the public API
    (it builds a ``torch.cuda.Stream`` object first: ~5 us a call, several times that on a
    busy host)."""
    return torch.cuda.current_stream(index).cuda_stream


PUBLIC_ONLY_VAR = "PYROUNDLIB_PUBLIC_TORCH_ONLY"


def pick_stream_query():
    """The one private torch name pyroundlib uses, behind a feature test: torch's C++ query of
    the raw current stream, ``torch._C._cuda_getCurrentRawStream(index)`` (~0.1 us; present in
    every torch from 2.4 to 2.14), when this torch has it; otherwise, or with
    PYROUNDLIB_PUBLIC_TORCH_ONLY=1 in the environment, ``public_stream_handle``.  Kept
    because every CUDA kernel call needs the handle, and the public route measured up to
    a third of a small call's host time on the H100 machine (benchmarks/NOTES.md).  Tests
    check both routes give the same handle, and run the suite with the public one forced."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None or os.environ.get(PUBLIC_ONLY_VAR, "") not in ("", "0"):
        return public_stream_handle
    return raw


current_stream_handle = pick_stream_query()


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
    own device; the library makes that device current around the launch.  A CPU call first
    gives the library torch's intra-op thread count and threads (``_threads.follow_torch``),
    among which it splits the work.  A non-zero
    status raises.  The CPU call releases the GIL while the kernel computes; the CUDA
    call, which only enqueues a launch, keeps it (``Library.entry``).  ``cpu=False``: an
    op with a CUDA entry point only; ``cuda=False``: with a CPU one only.
    """

    __slots__ = ("name", "has_cpu", "has_cuda", "_lib", "_cpu", "_cuda")

    def __init__(self, name: str, cpu: bool = True, cuda: bool = True):
        self.name, self.has_cpu, self.has_cuda = name, cpu, cuda
        self._lib = self._cpu = self._cuda = None

    def _bind(self):
        lib = _ffi.library()
        self._cpu = lib.entry(f"prl_{self.name}_cpu") if self.has_cpu else None
        self._cuda = lib.entry(f"prl_{self.name}_cuda", keep_gil=True) if self.has_cuda else None
        self._lib = lib

    def __call__(self, t: torch.Tensor, *args) -> None:
        if self._lib is None:
            self._bind()
        if t.is_cuda and self._cuda is not None:
            index = t.get_device()
            status = self._cuda(*args, index, current_stream_handle(index))  # see pick_stream_query
        elif t.is_cpu and self._cpu is not None:
            _threads.follow_torch()
            status = self._cpu(*args)
        else:
            raise ValueError(f"pyroundlib has no {self.name} kernel for device {t.device}")
        if status:
            self._lib.raise_status(status)


def ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()
