"""round_ste: a differentiable round (straight-through estimator).

Forward: round half to even, bit-for-bit ``torch.round``, in a native kernel.
Backward: the identity (the incoming gradient is returned as is, no kernel runs).

Layers: ``pyroundlib::round`` is a torch op (native kernel + fake implementation, so
torch.compile traces it); ``RoundSTEFunction`` gives it the straight-through gradient;
``round_ste`` checks arguments; ``RoundSTE`` is the module.  Every call goes through the
op, in eager mode too: one path, traced and run alike.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ._common import DTYPE_CODES, LIBRARY, Kernel, check_tensor, define_op

_round_kernel = Kernel("round")


def _round(x: Tensor, code: int) -> Tensor:
    """The kernel on a checked x whose dtype has the code ``code``."""
    x = x.contiguous()  # a copy, if one is made, lives until the kernel is enqueued on x's stream
    y = torch.empty_like(x)
    _round_kernel(x, x.data_ptr(), y.data_ptr(), x.numel(), code)
    return y


def _round_op(x: Tensor) -> Tensor:
    """Round half to even: the native kernel behind ``round_ste``, as a torch op."""
    check_tensor("x", x)
    return _round(x, DTYPE_CODES[x.dtype])


def _round_fake(x: Tensor) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _round_backward(ctx, grad: Tensor) -> Tensor:
    # The op alone is torch.round, whose derivative is zero almost everywhere;
    # the straight-through gradient is RoundSTEFunction's choice, made below.
    return torch.zeros_like(grad)


define_op("round(Tensor x) -> Tensor", _round_op, _round_fake)
torch.library.register_autograd("pyroundlib::round", _round_backward, lib=LIBRARY)


class RoundSTEFunction(torch.autograd.Function):
    """``RoundSTEFunction.apply(x)``: round half to even in the forward pass (a new tensor
    of x's shape and dtype), the identity in the backward (the incoming gradient itself).
    x: float32/float64/float16/bfloat16 on CPU or CUDA (``round_ste`` checks this)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return torch.ops.pyroundlib.round(x)  # the op checks x

    @staticmethod
    def backward(ctx, grad_output: Tensor) -> Tensor:
        return grad_output


def round_ste(x: Tensor) -> Tensor:
    """Round ``x`` half to even, with a straight-through (identity) gradient.

    x: any shape, float32/float64/float16/bfloat16, on CPU or CUDA. Returns a new
    tensor of x's shape and dtype; x is not modified.
    """
    check_tensor("x", x)  # raises for bad input, naming x
    if x.requires_grad and torch.is_grad_enabled():
        return RoundSTEFunction.apply(x)
    return torch.ops.pyroundlib.round(x)


class RoundSTE(torch.nn.Module):
    """``round_ste`` as a layer, e.g. a binarising bottleneck after ``torch.sigmoid``:
    ``nn.Sequential(nn.Linear(64, 16), nn.Sigmoid(), RoundSTE())`` gives 16 bits of 0./1.
    Input: any shape, float32/float64/float16/bfloat16; output: same shape and dtype."""

    def forward(self, x: Tensor) -> Tensor:
        return round_ste(x)
