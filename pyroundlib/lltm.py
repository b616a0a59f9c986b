"""The LLTM cell (PyTorch's C++/CUDA extension tutorial) with native pointwise steps.

The matrix product stays in PyTorch (``gates = X @ W^T + b`` with ``X = [old_h, input]``,
differentiated by autograd); the pointwise forward and backward run in native kernels
registered as the ops ``pyroundlib::lltm_forward`` and ``pyroundlib::lltm_backward``.
The backward kernel recomputes the activations from ``gates`` and ``old_cell``, so the
pointwise step saves only its two inputs.  ``LLTMPointwiseFunction`` makes the pointwise
step a torch.func-ready autograd Function; the backward runs as differentiable torch ops
instead of the kernel whenever a graph of the gradient is being built (double backward).
``pyroundlib::lltm_cell`` is the whole cell as a composite op, for TorchScript.
"""
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ._common import (DIRECT_WITHOUT_GRAD, DTYPE_CODES, LIBRARY, Kernel, autocast_cast, check_like, check_shape,
                      check_tensor, define_composite, define_op, function_for, has_tangent, no_gradient_wanted, ptr,
                      signature_once)

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
                      old_cell: Tensor, bias: bool = True) -> Tuple[Tensor, Tensor, Tensor]:
    """Pointwise LLTM backward: -> (d_gates [B, 3S], d_old_cell [B, S], d_bias [3S]), where
    d_bias = d_gates.sum(0) is the bias gradient (with bias=False: not computed, an empty
    tensor).  A None gradient is zero."""
    batch, state = _check_pointwise(gates, old_cell)
    for name, grad in (("grad_h", grad_h), ("grad_cell", grad_cell)):
        if grad is not None:
            check_like(name, grad, "old_cell", old_cell)
            check_shape(name, grad, (batch, state), "[batch, state]")
    fuse_bias = bias and (not gates.is_cuda or batch <= FUSED_BIAS_MAX_CUDA_BATCH)
    d_gates, d_old_cell, d_bias = _lltm_backward(grad_h, grad_cell, gates, old_cell, with_bias=fuse_bias)
    if d_bias is None:
        d_bias = d_gates.sum(dim=0) if bias else gates.new_empty(0)
    return d_gates, d_old_cell, d_bias


def _lltm_backward_fake(grad_h, grad_cell, gates, old_cell, bias=True):
    return torch.empty_like(gates, memory_format=torch.contiguous_format), \
        torch.empty_like(old_cell, memory_format=torch.contiguous_format), \
        gates.new_empty(gates.shape[1] if bias else 0)


def _activations(gates: Tensor, old_cell: Tensor):
    """The cell's activations in torch ops (the kernels' math, native/src/lltm.h)."""
    g_in, g_out, g_cand = gates.chunk(3, dim=1)
    input_gate, output_gate, candidate = torch.sigmoid(g_in), torch.sigmoid(g_out), F.elu(g_cand)
    tanh_cell = torch.tanh(old_cell + candidate * input_gate)
    d_elu = torch.where(g_cand > 0, torch.ones_like(g_cand), torch.exp(g_cand))
    return input_gate, output_gate, candidate, tanh_cell, d_elu


def _pointwise_differentiable(gates: Tensor, old_cell: Tensor) -> Tuple[Tensor, Tensor]:
    """(new_h, new_cell) in torch ops: what the entry points compute under forward mode
    (``has_tangent``), and the sequence's differentiable twin per step."""
    g_in, g_out, g_cand = gates.chunk(3, dim=1)
    new_cell = old_cell + F.elu(g_cand) * torch.sigmoid(g_in)
    return torch.tanh(new_cell) * torch.sigmoid(g_out), new_cell


def _backward_differentiable(grad_h: Optional[Tensor], grad_cell: Optional[Tensor], gates: Tensor,
                             old_cell: Tensor) -> Tuple[Tensor, Tensor]:
    """(d_gates, d_old_cell) as the backward kernel computes them, but in torch ops, so
    that autograd can differentiate the gradient again (double backward, torch.func).
    Used whenever a graph of the gradient is being built."""
    i, o, cand, tanh_cell, d_elu = _activations(gates, old_cell)
    grad_h = torch.zeros_like(old_cell) if grad_h is None else grad_h
    d_cell = grad_h * o * (1 - tanh_cell * tanh_cell)
    if grad_cell is not None:
        d_cell = d_cell + grad_cell
    d_gates = torch.cat([d_cell * cand * i * (1 - i), grad_h * tanh_cell * o * (1 - o), d_cell * i * d_elu], dim=1)
    return d_gates, d_cell


def _pointwise_backward(grad_h: Optional[Tensor], grad_cell: Optional[Tensor], gates: Tensor,
                        old_cell: Tensor) -> Tuple[Tensor, Tensor]:
    """(d_gates, d_old_cell): the native kernel, or its differentiable twin when autograd
    is recording (``create_graph=True``, torch.func)."""
    if torch.is_grad_enabled():
        return _backward_differentiable(grad_h, grad_cell, gates, old_cell)
    d_gates, d_old_cell, _ = torch.ops.pyroundlib.lltm_backward.default(grad_h, grad_cell, gates, old_cell, False)
    return d_gates, d_old_cell  # autograd's addmm backward sums the bias gradient


def _pointwise_jvp(gates: Tensor, old_cell: Tensor, t_gates: Optional[Tensor],
                   t_old_cell: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """Forward-mode derivative: the tangents of (new_h, new_cell) for the tangents of
    (gates, old_cell) (None: zero)."""
    i, o, cand, tanh_cell, d_elu = _activations(gates, old_cell)
    t_gates = torch.zeros_like(gates) if t_gates is None else t_gates
    t_in, t_out, t_cand = t_gates.chunk(3, dim=1)
    t_cell = cand * i * (1 - i) * t_in + d_elu * i * t_cand
    if t_old_cell is not None:
        t_cell = t_cell + t_old_cell
    t_h = (1 - tanh_cell * tanh_cell) * o * t_cell + tanh_cell * o * (1 - o) * t_out
    return t_h, t_cell


def _lltm_forward_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)
    ctx.set_materialize_grads(False)  # an unused output's gradient reaches C as NULL, not zeros


def _lltm_forward_backward(ctx, grad_h, grad_cell):
    return _pointwise_backward(grad_h, grad_cell, *ctx.saved_tensors)


# The pointwise op is differentiable on its own (in gates and old_cell, to any order);
# the backward op is a kernel, not differentiated itself: _pointwise_backward calls it
# only when no graph of the gradient is being built.
define_op("lltm_forward(Tensor gates, Tensor old_cell) -> (Tensor, Tensor)", _lltm_forward_op, _lltm_forward_fake,
          backward=_lltm_forward_backward, setup_context=_lltm_forward_setup, eager_twin=True)
define_op("lltm_backward(Tensor? grad_h, Tensor? grad_cell, Tensor gates, Tensor old_cell, bool bias=True) "
          "-> (Tensor, Tensor, Tensor)",
          _lltm_backward_op, _lltm_backward_fake)


def _batched_rows(info, in_dims, *tensors):
    """vmap: each tensor with its batch dimension first (expanded where it had none), then
    folded into the rows: [N, B, k] -> [N * B, k]."""
    out = []
    for t, dim in zip(tensors, in_dims):
        t = t.movedim(dim, 0) if dim is not None else t.expand(info.batch_size, *t.shape)
        out.append(t.reshape(-1, t.shape[-1]))
    return out


@signature_once
class _LLTMPointwiseNoJvp(torch.autograd.Function):
    """LLTMPointwiseFunction without its forward-mode derivative: what torch.compile
    traces (Dynamo refuses a Function that defines ``jvp``)."""

    @staticmethod
    def forward(gates: Tensor, old_cell: Tensor) -> Tuple[Tensor, Tensor]:
        return torch.ops.pyroundlib.lltm_forward(gates, old_cell)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        _lltm_forward_setup(ctx, inputs, output)

    @staticmethod
    def backward(ctx, grad_h: Optional[Tensor], grad_cell: Optional[Tensor]):
        return _lltm_forward_backward(ctx, grad_h, grad_cell)

    @staticmethod
    def vmap(info, in_dims, gates, old_cell):
        return _vmap_pointwise(_LLTMPointwiseNoJvp.apply, info, in_dims, gates, old_cell)


@signature_once
class LLTMPointwiseFunction(_LLTMPointwiseNoJvp):
    """The cell's pointwise step as an autograd Function: ``apply(gates, old_cell) ->
    (new_h, new_cell)``, gates [B, 3S] = X @ W^T + b, old_cell [B, S] (the op checks them).
    ``lltm_cell`` computes ``gates`` in PyTorch and applies this: autograd differentiates
    the GEMM, this Function the pointwise part (native kernels, or their differentiable
    twins when a graph of the gradient is built).  Written the way torch.func needs:
    ``setup_context``, a ``vmap`` rule (the batch folds into the rows) and ``jvp``.  Its
    forward calls ``pyroundlib::lltm_forward_no_autograd`` (the Function is the autograd
    node); under torch.compile ``lltm_cell`` applies the same Function without ``jvp``,
    which records the differentiable ``pyroundlib::lltm_forward``, and under export calls
    that op itself (its registered formulas are the Function's)."""

    @staticmethod
    def forward(gates: Tensor, old_cell: Tensor) -> Tuple[Tensor, Tensor]:
        return torch.ops.pyroundlib.lltm_forward_no_autograd.default(gates, old_cell)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        _lltm_forward_setup(ctx, inputs, output)
        ctx.save_for_forward(*inputs)

    @staticmethod
    def jvp(ctx, t_gates: Optional[Tensor], t_old_cell: Optional[Tensor]):
        gates, old_cell = ctx.saved_tensors
        return _pointwise_jvp(gates, old_cell, t_gates, t_old_cell)

    @staticmethod
    def vmap(info, in_dims, gates, old_cell):
        return _vmap_pointwise(LLTMPointwiseFunction.apply, info, in_dims, gates, old_cell)


def _vmap_pointwise(run, info, in_dims, gates, old_cell):
    """vmap of ``run`` (a Function's ``apply``, or the eager twin op): the batch folds into the rows."""
    rows_gates, rows_cell = _batched_rows(info, in_dims, gates, old_cell)
    new_h, new_cell = run(rows_gates, rows_cell)
    shape = (info.batch_size, -1, new_h.shape[-1])
    return (new_h.reshape(shape), new_cell.reshape(shape)), (0, 0)


# Where no gradient is wanted (inference, a decoding loop, vmap alone) eager ``lltm_cell`` calls
# the eager twin directly, without LLTMPointwiseFunction.apply (``no_gradient_wanted``): 0.70x
# the host time of a (16, 32, 128) cell under inference_mode on the development VM
# (benchmarks/NOTES.md).  The twin then needs a batching rule of its own.
if DIRECT_WITHOUT_GRAD:
    torch.library.register_vmap(
        "pyroundlib::lltm_forward_no_autograd",
        lambda info, in_dims, gates, old_cell: _vmap_pointwise(torch.ops.pyroundlib.lltm_forward_no_autograd.default,
                                                               info, in_dims, gates, old_cell), lib=LIBRARY)


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


def _lltm_cell(input: Tensor, weights: Tensor, bias: Tensor, old_h: Tensor, old_cell: Tensor,
               pointwise) -> Tuple[Tensor, Tensor]:
    """The cell: the autocast cast, the checks, the GEMM in PyTorch, then ``pointwise``."""
    input, weights, bias, old_h, old_cell = autocast_cast((input, weights, bias, old_h, old_cell))
    _check_lltm_args(input, weights, bias, old_h, old_cell)  # raises for bad input, naming it
    gates = F.linear(torch.cat([old_h, input], dim=1), weights, bias)  # addmm(bias, X, weights.t())
    if has_tangent((gates, old_cell)):  # forward mode: torch's formulas, right to any order
        return _pointwise_differentiable(gates, old_cell)
    return pointwise(gates, old_cell)


def _lltm_cell_op(input: Tensor, weights: Tensor, bias: Tensor, old_h: Tensor, old_cell: Tensor):
    return _lltm_cell(input, weights, bias, old_h, old_cell, torch.ops.pyroundlib.lltm_forward)


define_composite("lltm_cell(Tensor input, Tensor weights, Tensor bias, Tensor old_h, Tensor old_cell) "
                 "-> (Tensor, Tensor)", _lltm_cell_op)


def lltm_cell(input: Tensor, weights: Tensor, bias: Tensor, old_h: Tensor,
              old_cell: Tensor) -> Tuple[Tensor, Tensor]:
    """One LLTM step.

    input [B, I], weights [3S, S+I], bias [3S], old_h [B, S], old_cell [B, S], all of
    one floating dtype (float32/float64/float16/bfloat16) on one device (CPU or CUDA).
    Returns (new_h, new_cell), each [B, S].  Differentiable in every input, to any
    order; works under torch.func (grad, vmap, jacrev, jvp, jacfwd), torch.compile,
    export and TorchScript.  Under autocast the cell runs in the autocast dtype (as
    ``nn.LSTMCell`` does on CUDA); float32 parameters get float32 gradients.
    """
    if torch.jit.is_tracing():
        return torch.ops.pyroundlib.lltm_cell(input, weights, bias, old_h, old_cell)  # record the op
    if DIRECT_WITHOUT_GRAD and no_gradient_wanted((input, weights, bias, old_h, old_cell)):
        pointwise = torch.ops.pyroundlib.lltm_forward_no_autograd.default  # no node: no gradient is wanted
    else:
        pointwise = function_for(torch.ops.pyroundlib.lltm_forward.default, _LLTMPointwiseNoJvp,
                                 LLTMPointwiseFunction)
    return _lltm_cell(input, weights, bias, old_h, old_cell, pointwise)


class LLTMFunction(torch.autograd.Function):
    """The whole cell as one autograd Function, shaped as the tutorial's ``LLTMFunction`` (and
    pyroundlib 0.2.0's): ``LLTMFunction.apply(input, weights, bias, old_h, old_cell) -> (new_h,
    new_cell)``.  The same kernels as ``lltm_cell``; first derivatives only (as the
    tutorial's), in eager mode.  ``lltm_cell`` also checks its arguments and works under
    autocast, double backward, torch.func, torch.compile and export: prefer it in new code."""

    @staticmethod
    def forward(ctx, input: Tensor, weights: Tensor, bias: Tensor, old_h: Tensor, old_cell: Tensor):
        X = torch.cat([old_h, input], dim=1)
        gates = torch.addmm(bias, X, weights.t())
        new_h, new_cell = torch.ops.pyroundlib.lltm_forward_no_autograd.default(gates, old_cell)
        ctx.save_for_backward(X, weights, gates, old_cell)
        ctx.set_materialize_grads(False)  # an unused output's gradient reaches the kernel as NULL
        return new_h, new_cell

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_h: Optional[Tensor], grad_cell: Optional[Tensor]):
        X, weights, gates, old_cell = ctx.saved_tensors
        d_gates, d_old_cell, d_bias = torch.ops.pyroundlib.lltm_backward.default(grad_h, grad_cell, gates, old_cell)
        d_X = d_gates.mm(weights)
        state = old_cell.shape[1]
        return d_X[:, state:], d_gates.t().mm(X), d_bias, d_X[:, :state], d_old_cell


class LLTMParameters(torch.nn.Module):
    """The parameters the LLTM cell and layer share: ``weights`` [3*state_size,
    state_size+input_features] and ``bias`` [3*state_size], initialised uniform in
    +-1/sqrt(state_size) as in the tutorial."""

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

    def extra_repr(self) -> str:
        return f"input_features={self.input_features}, state_size={self.state_size}"

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # a one-layer, one-direction LLTMLayer's checkpoint: its layer 0 is the cell
        for old, new in (("weights_l0", "weights"), ("bias_l0", "bias")):
            if prefix + old in state_dict and prefix + new not in state_dict:
                state_dict[prefix + new] = state_dict.pop(prefix + old)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)


class LLTM(LLTMParameters):
    """The LLTM recurrent cell: ``forward(input, (h, c)) -> (new_h, new_cell)``, with the
    parameters of ``LLTMParameters``."""

    def forward(self, input: Tensor, state: Optional[Tuple[Tensor, Tensor]] = None) -> Tuple[Tensor, Tensor]:
        """input [B, input_features]; state (h, c), each [B, state_size], zeros if omitted
        (as for torch.nn.LSTMCell).  Returns (new_h, new_cell), each [B, state_size]."""
        if state is None:
            zeros = input.new_zeros(input.shape[0] if input.dim() == 2 else 0, self.state_size)
            state = (zeros, zeros)
        if torch.jit.is_scripting():
            return torch.ops.pyroundlib.lltm_cell(input, self.weights, self.bias, state[0], state[1])
        return lltm_cell(input, self.weights, self.bias, state[0], state[1])
