"""round_ste: a differentiable round (straight-through estimator).

Forward: round half to even, bit-for-bit ``torch.round``, in a native kernel.
Backward: the identity (the incoming gradient is returned as is, no kernel runs); so is
the forward-mode derivative, and the second derivative is zero.

Layers:
- ``pyroundlib::round`` is a torch op (native kernel + fake implementation),
  differentiable as ``torch.round`` is (gradient zero).
- ``pyroundlib::round_ste`` is the same kernel as an op whose registered gradient is the
  straight-through one: what TorchScript (``torch.jit.script`` / ``trace``), torch.compile
  and export record.  ``pyroundlib::round_ste_no_autograd``, the kernel without a formula,
  is what ``RoundSTEFunction`` calls in eager mode (the Function is the autograd node).
- ``RoundSTEFunction`` gives the round the straight-through gradient; it is written for
  torch.func (``setup_context``, a ``vmap`` rule, and in eager mode a ``jvp``).
- ``round_ste`` checks its argument and picks the route (where no gradient is wanted, the
  ``_no_autograd`` op directly, which has a vmap rule of its own); ``RoundSTE`` is the module.
"""
import torch
from torch import Tensor

from ._common import (DIRECT_WITHOUT_GRAD, LIBRARY, DTYPE_CODES, Kernel, check_tensor, define_op, function_for,
                      has_tangent, no_gradient_wanted, signature_once)
from .reference import round_ste_reference

_round_kernel = Kernel("round")


def _round_op(x: Tensor) -> Tensor:
    """Round half to even: the native kernel behind ``round_ste``, as a torch op."""
    check_tensor("x", x)
    x = x.contiguous()  # a copy, if one is made, lives until the kernel is enqueued on x's stream
    y = torch.empty_like(x)
    _round_kernel(x, x.data_ptr(), y.data_ptr(), x.numel(), DTYPE_CODES[x.dtype])
    return y


def _round_fake(x: Tensor) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _zero_gradient(ctx, grad: Tensor) -> Tensor:
    return torch.zeros_like(grad)  # torch.round's derivative: zero almost everywhere


def _straight_through(ctx, grad: Tensor) -> Tensor:
    return grad


define_op("round(Tensor x) -> Tensor", _round_op, _round_fake, backward=_zero_gradient)
define_op("round_ste(Tensor x) -> Tensor", _round_op, _round_fake, backward=_straight_through, eager_twin=True)


def _round_vmap(info, in_dims, x):
    return torch.ops.pyroundlib.round_ste_no_autograd.default(x), in_dims[0]  # elementwise: the batch as a whole


# Where no gradient is wanted (grad mode off, or x does not require grad: inference, an
# optimiser step, vmap alone) eager ``round_ste`` calls the kernel's op directly, without
# ``RoundSTEFunction.apply``: ~8 of its ~19 us of host time at 2^16 floats on the
# development VM (benchmarks/NOTES.md).  Under vmap the op then needs its own batching rule.
if DIRECT_WITHOUT_GRAD:
    torch.library.register_vmap("pyroundlib::round_ste_no_autograd", _round_vmap, lib=LIBRARY)


@signature_once
class _RoundSTENoJvp(torch.autograd.Function):
    """RoundSTEFunction without its forward-mode derivative: what torch.compile traces
    (Dynamo refuses a Function that defines ``jvp``).  Its forward records the op with the
    straight-through formula."""

    @staticmethod
    def forward(x: Tensor) -> Tensor:
        return torch.ops.pyroundlib.round_ste(x)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        pass  # the backward needs nothing

    @staticmethod
    def backward(ctx, grad_output: Tensor) -> Tensor:
        return grad_output

    @staticmethod
    def vmap(info, in_dims, x):
        return _RoundSTENoJvp.apply(x), in_dims[0]


@signature_once
class RoundSTEFunction(_RoundSTENoJvp):
    """``RoundSTEFunction.apply(x)``: round half to even in the forward pass (a new tensor
    of x's shape and dtype), the identity in the backward (the incoming gradient itself)
    and in forward mode.  x: float32/float64/float16/bfloat16 on CPU or CUDA (the op
    checks it).

    Written the way torch.func needs: ``forward`` without ``ctx`` plus ``setup_context``,
    a ``vmap`` rule (rounding is elementwise: the batched tensor is rounded as a whole) and
    ``jvp``.  Its forward calls ``pyroundlib::round_ste_no_autograd``: the Function is the
    autograd node.  Under torch.compile ``round_ste`` applies the same Function without
    ``jvp``; under export and ``jit.trace`` it calls ``pyroundlib::round_ste`` itself (the
    same straight-through formula, registered with the op)."""

    @staticmethod
    def forward(x: Tensor) -> Tensor:
        return torch.ops.pyroundlib.round_ste_no_autograd.default(x)

    @staticmethod
    def jvp(ctx, x_tangent: Tensor) -> Tensor:
        return x_tangent  # the straight-through derivative is the identity, forward mode too

    @staticmethod
    def vmap(info, in_dims, x):
        return RoundSTEFunction.apply(x), in_dims[0]


def round_ste(x: Tensor) -> Tensor:
    """Round ``x`` half to even, with a straight-through (identity) gradient.

    x: any shape, float32/float64/float16/bfloat16, on CPU or CUDA. Returns a new
    tensor of x's shape and dtype; x is not modified.  Works under autograd (double
    backward too: the second derivative is zero), torch.func (grad, vmap, jacrev, jvp,
    jacfwd), autocast (x keeps its dtype), torch.compile, export and TorchScript.
    """
    check_tensor("x", x)  # raises for bad input, naming x
    if has_tangent((x,)):  # forward mode: the idiom in torch ops (under torch.compile the op's tangent is lost)
        return round_ste_reference(x)
    if DIRECT_WITHOUT_GRAD and no_gradient_wanted((x,)):
        return torch.ops.pyroundlib.round_ste_no_autograd.default(x)  # eager, no gradient wanted (above)
    return function_for(torch.ops.pyroundlib.round_ste.default, _RoundSTENoJvp, RoundSTEFunction)(x)


class RoundSTE(torch.nn.Module):
    """``round_ste`` as a layer, e.g. a binarising bottleneck after ``torch.sigmoid``:
    ``nn.Sequential(nn.Linear(64, 16), nn.Sigmoid(), RoundSTE())`` gives 16 bits of 0./1.
    Input: any shape, float32/float64/float16/bfloat16; output: same shape and dtype.
    ``torch.jit.script`` compiles it to the op ``pyroundlib::round_ste``."""

    def forward(self, x: Tensor) -> Tensor:
        if torch.jit.is_scripting():
            return torch.ops.pyroundlib.round_ste(x)
        return round_ste(x)
