"""The LLTM cell (PyTorch's C++/CUDA extension tutorial) with native pointwise steps.

The matrix product stays in PyTorch (``gates = X @ W^T + b`` with ``X = [old_h, input]``);
the pointwise forward and backward run in native kernels registered as the custom ops
``pyroundlib::lltm_forward`` and ``pyroundlib::lltm_backward``.  The backward kernel
recomputes the activations from ``gates`` and ``old_cell``, so the forward saves only
``X``, ``weights``, ``gates`` and ``old_cell``.  Every call goes through the ops, in
eager mode too: one path, traced and run alike.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from ._common import DTYPE_CODES, LIBRARY, Kernel, check_like, check_shape, check_tensor, define_op, ptr

_forward_kernel = Kernel("lltm_forward")
_backward_kernel = Kernel("lltm_backward")

# The bias gradient (the column sums of d_gates) is computed inside the backward kernel
# on the CPU always, and on CUDA up to this batch size: there the fused kernel gives
# each 32 columns one block, which saves a reduction launch (what counts while the
# host is the bottleneck) but streams large batches slower than a separate reduction.
FUSED_BIAS_MAX_CUDA_BATCH = 256


def _check_pointwise(gates: Tensor, old_cell: Tensor) -> Tuple[int, int]:
    check_tensor("old_cell", old_cell)
    check_like("gates", gates, "old_cell", old_cell)
    if old_cell.dim() != 2:
        raise ValueError(f"old_cell must be 2-D [batch, state], got shape {list(old_cell.shape)}")
    batch, state = old_cell.shape
    check_shape("gates", gates, (batch, 3 * state), "[batch, 3*state]")
    return batch, state


def _lltm_forward(gates: Tensor, old_cell: Tensor) -> Tuple[Tensor, Tensor]:
    gates, old_cell = gates.contiguous(), old_cell.contiguous()
    new_h, new_cell = torch.empty_like(old_cell), torch.empty_like(old_cell)
    batch, state = old_cell.shape
    _forward_kernel(old_cell, gates.data_ptr(), old_cell.data_ptr(), new_h.data_ptr(), new_cell.data_ptr(),
                    batch, state, DTYPE_CODES[old_cell.dtype])
    return new_h, new_cell


def _lltm_backward(grad_h: Optional[Tensor], grad_cell: Optional[Tensor], gates: Tensor, old_cell: Tensor,
                   with_bias: bool = False) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """(d_gates, d_old_cell, d_bias): d_bias = d_gates.sum(0), computed in the same kernel,
    when with_bias (else None)."""
    gates, old_cell = gates.contiguous(), old_cell.contiguous()
    grad_h = grad_h.contiguous() if grad_h is not None else None
    grad_cell = grad_cell.contiguous() if grad_cell is not None else None
    d_gates, d_old_cell = torch.empty_like(gates), torch.empty_like(old_cell)
    d_bias = gates.new_empty(gates.shape[1]) if with_bias else None
    batch, state = old_cell.shape
    _backward_kernel(old_cell, ptr(grad_h), ptr(grad_cell), gates.data_ptr(), old_cell.data_ptr(),
                     d_gates.data_ptr(), d_old_cell.data_ptr(), ptr(d_bias), batch, state,
                     DTYPE_CODES[old_cell.dtype])
    return d_gates, d_old_cell, d_bias


def _lltm_forward_op(gates: Tensor, old_cell: Tensor) -> Tuple[Tensor, Tensor]:
    """Pointwise LLTM forward: (gates [B, 3S], old_cell [B, S]) -> (new_h, new_cell), each [B, S]."""
    _check_pointwise(gates, old_cell)
    return _lltm_forward(gates, old_cell)


def _lltm_forward_fake(gates: Tensor, old_cell: Tensor) -> Tuple[Tensor, Tensor]:
    return torch.empty_like(old_cell, memory_format=torch.contiguous_format), \
        torch.empty_like(old_cell, memory_format=torch.contiguous_format)


def _lltm_backward_op(grad_h: Optional[Tensor], grad_cell: Optional[Tensor], gates: Tensor,
                      old_cell: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """Pointwise LLTM backward: -> (d_gates [B, 3S], d_old_cell [B, S], d_bias [3S]), where
    d_bias = d_gates.sum(0) is the bias gradient.  A None gradient is zero."""
    batch, state = _check_pointwise(gates, old_cell)
    for name, grad in (("grad_h", grad_h), ("grad_cell", grad_cell)):
        if grad is not None:
            check_like(name, grad, "old_cell", old_cell)
            check_shape(name, grad, (batch, state), "[batch, state]")
    fuse_bias = not gates.is_cuda or batch <= FUSED_BIAS_MAX_CUDA_BATCH
    d_gates, d_old_cell, d_bias = _lltm_backward(grad_h, grad_cell, gates, old_cell, with_bias=fuse_bias)
    if d_bias is None:
        d_bias = d_gates.sum(dim=0)
    return d_gates, d_old_cell, d_bias


def _lltm_backward_fake(grad_h, grad_cell, gates, old_cell):
    return torch.empty_like(gates, memory_format=torch.contiguous_format), \
        torch.empty_like(old_cell, memory_format=torch.contiguous_format), \
        gates.new_empty(gates.shape[1])


define_op("lltm_forward(Tensor gates, Tensor old_cell) -> (Tensor, Tensor)", _lltm_forward_op, _lltm_forward_fake)
define_op("lltm_backward(Tensor? grad_h, Tensor? grad_cell, Tensor gates, Tensor old_cell) -> (Tensor, Tensor, Tensor)",
          _lltm_backward_op, _lltm_backward_fake)


def _lltm_forward_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _lltm_forward_backward(ctx, grad_h, grad_cell):
    gates, old_cell = ctx.saved_tensors
    d_gates, d_old_cell, _ = torch.ops.pyroundlib.lltm_backward(grad_h, grad_cell, gates, old_cell)
    return d_gates, d_old_cell


# The pointwise op is differentiable on its own too (in gates and old_cell); the
# backward op is not (no double backward).
torch.library.register_autograd("pyroundlib::lltm_forward", _lltm_forward_backward,
                                setup_context=_lltm_forward_setup, lib=LIBRARY)


class LLTMFunction(torch.autograd.Function):
    """One LLTM step as an autograd Function: ``LLTMFunction.apply(input, weights, bias,
    old_h, old_cell) -> (new_h, new_cell)``, shapes as for ``lltm_cell``, which checks
    them all (applied directly, only the pointwise op's checks of ``gates`` and
    ``old_cell`` run).  Saves X = [old_h, input], weights, gates and old_cell; the
    backward's GEMMs run only for the inputs that need a gradient."""

    @staticmethod
    def forward(ctx, input: Tensor, weights: Tensor, bias: Tensor, old_h: Tensor,
                old_cell: Tensor) -> Tuple[Tensor, Tensor]:
        X = torch.cat([old_h, input], dim=1)
        gates = torch.nn.functional.linear(X, weights, bias)  # addmm(bias, X, weights.t()) in one call
        new_h, new_cell = torch.ops.pyroundlib.lltm_forward(gates, old_cell)
        ctx.save_for_backward(X, weights, gates, old_cell)
        ctx.set_materialize_grads(False)  # an unused output's gradient reaches C as NULL, not zeros
        return new_h, new_cell

    @staticmethod
    def backward(ctx, grad_h: Optional[Tensor], grad_cell: Optional[Tensor]):
        X, weights, gates, old_cell = ctx.saved_tensors
        need_input, need_weights, need_bias, need_old_h = ctx.needs_input_grad[:4]
        d_gates, d_old_cell, d_bias = torch.ops.pyroundlib.lltm_backward(grad_h, grad_cell, gates, old_cell)
        d_input = d_weights = d_old_h = None
        if need_weights:
            d_weights = d_gates.t().mm(X)
        if not need_bias:
            d_bias = None
        if need_input or need_old_h:
            state = old_cell.shape[1]
            d_old_h, d_input = d_gates.mm(weights).split_with_sizes([state, X.shape[1] - state], dim=1)
        return d_input, d_weights, d_bias, d_old_h, d_old_cell


def _check_lltm_args(input, weights, bias, old_h, old_cell) -> None:
    """Raise TypeError/ValueError naming the first bad argument."""
    check_tensor("input", input)
    for name, value in (("weights", weights), ("bias", bias), ("old_h", old_h), ("old_cell", old_cell)):
        check_like(name, value, "input", input)
    if input.dim() != 2:
        raise ValueError(f"input must be 2-D [batch, input_features], got shape {list(input.shape)}")
    if old_h.dim() != 2:
        raise ValueError(f"old_h must be 2-D [batch, state_size], got shape {list(old_h.shape)}")
    batch, features = input.shape
    state = old_h.shape[1]
    sizes = f"(batch={batch}, input_features={features} from input; state_size={state} from old_h)"
    check_shape("old_h", old_h, (batch, state), f"[batch, state_size] {sizes}")
    check_shape("old_cell", old_cell, (batch, state), f"[batch, state_size] {sizes}")
    check_shape("weights", weights, (3 * state, state + features),
                f"[3*state_size, state_size+input_features] {sizes}")
    check_shape("bias", bias, (3 * state,), f"[3*state_size] {sizes}")


def _lltm_args_ok(input, weights, bias, old_h, old_cell) -> bool:
    """The common case (CPU or CUDA tensors of one supported dtype and device, consistent
    shapes) in one expression, a few us cheaper than _check_lltm_args, which runs when
    this is False, to name what is wrong (or to admit meta tensors)."""
    try:
        dtype, device = input.dtype, input.device
        batch, features = input.shape
        _, state = old_h.shape
        return (dtype in DTYPE_CODES and device.type in ("cpu", "cuda")
                and weights.dtype == dtype and bias.dtype == dtype and old_h.dtype == dtype and old_cell.dtype == dtype
                and weights.shape == (3 * state, state + features) and bias.shape == (3 * state,)
                and old_h.shape == (batch, state) and old_cell.shape == (batch, state)
                and weights.device == device and bias.device == device and old_h.device == device
                and old_cell.device == device)
    except (AttributeError, TypeError, ValueError):
        return False


def lltm_cell(input: Tensor, weights: Tensor, bias: Tensor, old_h: Tensor,
              old_cell: Tensor) -> Tuple[Tensor, Tensor]:
    """One LLTM step.

    input [B, I], weights [3S, S+I], bias [3S], old_h [B, S], old_cell [B, S], all of
    one floating dtype (float32/float64/float16/bfloat16) on one device (CPU or CUDA).
    Returns (new_h, new_cell), each [B, S].  Differentiable in every input.
    """
    if not _lltm_args_ok(input, weights, bias, old_h, old_cell):
        _check_lltm_args(input, weights, bias, old_h, old_cell)  # raises for bad input, naming it
    if torch.is_grad_enabled() and (input.requires_grad or weights.requires_grad or bias.requires_grad
                                    or old_h.requires_grad or old_cell.requires_grad):
        return LLTMFunction.apply(input, weights, bias, old_h, old_cell)
    # inference: no autograd node, nothing saved
    gates = torch.nn.functional.linear(torch.cat([old_h, input], dim=1), weights, bias)
    return torch.ops.pyroundlib.lltm_forward(gates, old_cell)


class LLTM(torch.nn.Module):
    """The LLTM recurrent cell: ``forward(input, (h, c)) -> (new_h, new_cell)``.

    Parameters ``weights`` [3*state_size, state_size+input_features] and ``bias``
    [3*state_size], initialised uniform in +-1/sqrt(state_size) as in the tutorial.
    """

    def __init__(self, input_features: int, state_size: int, device=None, dtype=None):
        super().__init__()
        self.input_features = input_features
        self.state_size = state_size
        factory = {"device": device, "dtype": dtype}
        self.weights = torch.nn.Parameter(torch.empty(3 * state_size, input_features + state_size, **factory))
        self.bias = torch.nn.Parameter(torch.empty(3 * state_size, **factory))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.state_size)
        with torch.no_grad():
            for weight in self.parameters():
                weight.uniform_(-stdv, +stdv)

    def forward(self, input: Tensor, state: Optional[Tuple[Tensor, Tensor]] = None) -> Tuple[Tensor, Tensor]:
        """input [B, input_features]; state (h, c), each [B, state_size], zeros if omitted
        (as for torch.nn.LSTMCell).  Returns (new_h, new_cell), each [B, state_size]."""
        if state is None:
            zeros = input.new_zeros(input.shape[0] if input.dim() == 2 else 0, self.state_size)
            state = (zeros, zeros)
        old_h, old_cell = state
        return lltm_cell(input, self.weights, self.bias, old_h, old_cell)

    def extra_repr(self) -> str:
        return f"input_features={self.input_features}, state_size={self.state_size}"
