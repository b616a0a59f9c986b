"""LLTMLayer: the LLTM over whole sequences with nn.LSTM's interface: stacked layers, both
directions, dropout between layers, packed variable-length batches.

Each layer and direction is one ``lltm_sequence`` call (one autograd node); the reverse
direction runs the sequence flipped in time and flips its output back.  Layer k > 0 takes the
D*S features of layer k - 1 (both directions concatenated), with dropout in between in
training mode.  Parameters are named as ``nn.LSTM`` names its own: ``weights_l{k}``,
``bias_l{k}`` and ``..._reverse``, each in the cell's layout ([3S, S + input width] and [3S]).
A PackedSequence runs each layer and direction with a recurrence that takes the pack's batch
sizes (``_packed.py``), each sequence exactly its own steps.

Where no gradient is wanted (inference) and the fused CUDA kernels take every layer (short
sequences of small states), the whole stack is one op, ``pyroundlib::lltm_layers_inference``:
one trip through the dispatcher, no autograd node, and each layer's directions in one launch
that reads the sequence (or a pack's rows, each sequence its own steps) backwards for the
reverse one and writes nn.LSTM's output layout, h_n and c_n in place, a pack's states in the
caller's order (``prl_lltm_layer_fused_inference_cuda``).  0.28x the time of the
layer-by-layer inference at (T, B, I, S) = (8, 32, 8, 64) padded, 0.36x packed (H100,
benchmarks/NOTES.md).  On the CPU the op runs a padded batch, each direction the library
loop's call (0.85-0.88x the layer-by-layer time at that size).  In
training the stack is one autograd node (``LLTMStackFunction``) over the calls a node per
direction would make: a bidirectional padded stack on that route (on the CPU, the library
loop's), 0.72-0.80x the time forward+backward on an H100, and a pack on any device, 0.85-0.99x;
on CUDA such a padded stack replays its forward and its backward each from one CUDA graph
where graphs are on (``_replays_stack``: 0.62x the time again at (8, 32, 8, 64) in float32).
Where a bidirectional layer's directions would each run the step loop on CUDA (the kernels do
not fit), they run as one step loop in lockstep, a padded batch's replayed from CUDA graphs
(``_Padded.both_forward``) and a pack's from Python (``_packed.both_forward``).
"""
from __future__ import annotations

import functools
import itertools
import math
import warnings
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence

from . import graphs, sequence
from ._common import (DIRECT_WITHOUT_GRAD, DTYPE_CODES, LIBRARY, Kernel, autocast_cast, check_like, check_shape,
                      check_tensor, define_op, exporting, has_tangent, no_gradient_wanted, ptr)
from . import _packed
from ._packed import Pack, packed_direction
from .lltm import _forward_kernel as _cell_forward_kernel
from .sequence import _backward_parts_kernel, lltm_sequence

_layer_inference_kernel = Kernel("lltm_layer_fused_inference", cpu=False)
LOCKSTEP = "steps, both directions in lockstep"  # a layer's route (_Packed.lockstep, _Padded.lockstep)


def _check_stack_args(input, weights, bias, h0, c0, directions, first=None, lengths=None, order=None) -> None:
    """Raise TypeError/ValueError naming the first bad argument of lltm_layers_inference."""
    check_tensor("input", input)
    if (first is None) != (lengths is None):
        raise ValueError("first and lengths must both be given (a pack) or both be None (a padded batch)")
    if first is not None:
        for name, t in (("first", first), ("lengths", lengths)) + ((("order", order),) if order is not None else ()):
            if not isinstance(t, Tensor) or t.dtype != torch.int64 or t.dim() != 1 or t.device != input.device:
                raise ValueError(f"{name} must be a 1-D int64 tensor on {input.device} (a pack's), got "
                                 f"{t.dtype if isinstance(t, Tensor) else type(t).__name__}")
        if input.dim() != 2:
            raise ValueError(f"input must be a pack's rows, 2-D [rows, input_features], got shape "
                             f"{list(input.shape)}")
    elif input.dim() != 3:
        raise ValueError(f"input must be 3-D [time, batch, input_features], got shape {list(input.shape)}")
    if order is not None and (first is None or order.shape != lengths.shape):
        raise ValueError(f"order must be given with a pack only, one row a sequence (as lengths), got shape "
                         f"{list(order.shape)}")
    if directions not in (1, 2):
        raise ValueError(f"directions must be 1 or 2, got {directions}")
    if not weights or len(weights) % directions or len(bias) != len(weights):
        raise ValueError(f"weights and bias must hold one tensor per layer and direction, got {len(weights)} and "
                         f"{len(bias)} for {directions} direction(s)")
    if (h0 is None) != (c0 is None):
        raise ValueError("h0 and c0 must both be given or both be None (zeros)")
    steps, batch, features = input.shape if first is None else (len(first), len(lengths), input.shape[1])
    state = weights[0].shape[0] // 3 if weights[0].dim() == 2 else 0
    dtype, device = input.dtype, input.device
    # (shape, name, tensors, index of the first): h0 and c0, the first layer's weights, the
    # later layers' (D*S inputs), the biases; the names formed only for a bad argument
    expected = (((len(weights), batch, state), "h0", (h0, c0) if h0 is not None else (), 0),
                ((3 * state, state + features), "weights", weights[:directions], 0),
                ((3 * state, state + directions * state), "weights", weights[directions:], directions),
                ((3 * state,), "bias", bias, 0))
    for shape, name, tensors, offset in expected:
        for k, t in enumerate(tensors):
            if not (isinstance(t, Tensor) and t.dtype == dtype and t.device == device and t.shape == shape):
                name, meaning = (("h0", "c0")[k], "[num_layers*num_directions, batch, state_size]") if name == "h0" \
                    else (f"bias[{k}]", "[3*state_size]") if name == "bias" \
                    else (f"weights[{offset + k}]", f"[3*state_size, state_size+{shape[1] - state}]")
                check_like(name, t, "input", input)  # raises for a wrong type, dtype or device
                check_shape(name, t, shape, meaning)


def _all_fused(t: Tensor, steps: int, batch: int, features: int, state: int, directions: int, layers: int,
               inference: bool = True, route: str = sequence.FUSED) -> bool:
    """Whether every layer takes the fused kernels (or ``route``: sequence._route), in inference
    or training.  The layers past the first share an input width (D*S): two routes to ask."""
    widths = {features} if layers == 1 else {features, directions * state}
    return all(sequence._route(t, steps, batch, width, state, inference=inference) is route for width in widths)


def _stack_inference(input: Tensor, weights: List[Tensor], bias: List[Tensor], h0: Optional[Tensor],
                     c0: Optional[Tensor], directions: int, first: Optional[Tensor] = None,
                     lengths: Optional[Tensor] = None, order: Optional[Tensor] = None):
    """Every layer and direction's forward, no backward following: on CUDA with the fused
    kernels (where they fit every layer's sizes), on the CPU with its library loop (padded
    only).  input [T, B, I] (T >= 1), weights and bias in nn.LSTM's order, h0 and c0
    [L*D, B, S] (None: zeros) -> (output [T, B, D*S], h_n, c_n [L*D, B, S]).  A pack
    (``_packed.Pack``, CUDA): input its rows [N, I], first and lengths its ``first`` and
    ``lengths`` (their shapes are checked, their values, on the device, are the Pack's to get
    right); output [N, D*S]; the states in its sorted order, or with ``order`` (its
    ``sorted_indices``) in the caller's: sorted row b is state row order[b]."""
    _check_stack_args(input, weights, bias, h0, c0, directions, first, lengths, order)
    steps, batch, features = input.shape if first is None else (len(first), len(lengths), input.shape[1])
    state = weights[0].shape[0] // 3
    layers = len(weights) // directions
    widths = {features} if layers == 1 else {features, directions * state}
    if input.is_cuda and all(sequence._fits(sequence._fused_fits, "prl_lltm_sequence_fused_cuda_fits", input, batch,
                                            width, state) for width in widths):
        # every layer's directions in one launch, h_n and c_n written in place; the states'
        # rows [k*D, (k+1)*D) are layer k's, at a byte offset of its own
        x = input.contiguous()
        first, lengths, order = (None if t is None else t.contiguous() for t in (first, lengths, order))
        pack = (ptr(first), ptr(lengths), ptr(order))  # held above while the launches read them
        h_n, c_n = x.new_empty(len(weights), batch, state), x.new_empty(len(weights), batch, state)
        h0, c0 = (None, None) if h0 is None else (h0.contiguous(), c0.contiguous())
        step = directions * batch * state * x.element_size()
        ws, bs = [w.contiguous() for w in weights], [b.contiguous() for b in bias]
        for k in range(layers):
            d = k * directions
            output = x.new_empty(*x.shape[:-1], directions * state)
            reverse = (ws[d + 1].data_ptr(), bs[d + 1].data_ptr()) if directions == 2 else (None, None)
            given = (None, None) if h0 is None else (h0.data_ptr() + k * step, c0.data_ptr() + k * step)
            _layer_inference_kernel(x, x.data_ptr(), ws[d].data_ptr(), bs[d].data_ptr(), *reverse, *given, *pack,
                                    output.data_ptr(), h_n.data_ptr() + k * step, c_n.data_ptr() + k * step,
                                    directions, steps, batch, x.shape[-1], state, DTYPE_CODES[x.dtype])
            x = output
        return x, h_n, c_n
    if input.is_cpu and first is None and batch * 3 * state < 2**31:  # sizes the library loop takes
        # each direction the library loop's call, as lltm_sequence's (the reverse one over the
        # sequence flipped in time): one dispatch for the stack instead of one a direction
        x, zeros, h_n, c_n = input.contiguous(), input.new_zeros(batch, state), [], []
        weights, bias = [w.contiguous() for w in weights], [b.contiguous() for b in bias]
        h0, c0 = (None, None) if h0 is None else (h0.contiguous(), c0.contiguous())
        for k in range(layers):
            outputs = []
            for d in range(directions):
                i = k * directions + d
                given = (zeros, zeros) if h0 is None else (h0[i], c0[i])
                output, c, _, _ = sequence._forward_one_call(x.flip(0) if d else x, weights[i], bias[i], *given)
                outputs.append(output.flip(0) if d else output)
                h_n.append(output[-1])
                c_n.append(c)
            x = torch.cat(outputs, dim=-1) if directions == 2 else outputs[0]
        return x, torch.stack(h_n), torch.stack(c_n)
    raise ValueError(f"lltm_layers_inference runs a padded batch on the CPU (the library loop) and, on CUDA, a padded "
                     f"batch or a pack where the fused kernels take every layer; not at steps={steps}, batch={batch}, "
                     f"input_features={features}, state_size={state}, {input.dtype}, "
                     f"{'a pack' if first is not None else 'padded'} on {input.device} (LLTMLayer runs such a stack "
                     f"layer by layer)")


def _stack_fake(input, weights, bias, h0, c0, directions, first=None, lengths=None, order=None):
    _check_stack_args(input, weights, bias, h0, c0, directions, first, lengths, order)
    state = weights[0].shape[0] // 3
    batch = input.shape[1] if first is None else lengths.shape[0]
    return (input.new_empty(*input.shape[:-1], directions * state), input.new_empty(len(weights), batch, state),
            input.new_empty(len(weights), batch, state))


define_op("lltm_layers_inference(Tensor input, Tensor[] weights, Tensor[] bias, Tensor? h0, Tensor? c0, "
          "int directions, Tensor? first=None, Tensor? lengths=None, Tensor? order=None) -> (Tensor, Tensor, Tensor)",
          _stack_inference,
          _stack_fake)


def _stack_vmap(info, in_dims, input, weights, bias, h0, c0, directions, first=None, lengths=None, order=None):
    """vmap of lltm_layers_inference: one stack per index of the vmapped dimension."""
    def at(t, dim, i):
        return t if dim is None else t.select(dim, i)

    def each(ts, dims, i):
        return [at(t, d, i) for t, d in zip(ts, dims if dims is not None else [None] * len(ts))]

    outs = [torch.ops.pyroundlib.lltm_layers_inference.default(
        at(input, in_dims[0], i), each(weights, in_dims[1], i), each(bias, in_dims[2], i),
        None if h0 is None else at(h0, in_dims[3], i), None if c0 is None else at(c0, in_dims[4], i), directions,
        first, lengths, order) for i in range(info.batch_size)]
    return tuple(torch.stack(o) for o in zip(*outs)), (0, 0, 0)


if DIRECT_WITHOUT_GRAD:
    torch.library.register_vmap("pyroundlib::lltm_layers_inference", _stack_vmap, lib=LIBRARY)


# ---- training: the whole stack as one autograd node (LLTMStackFunction) -------------------------

def _padded_direction(x: Tensor, weights: Tensor, bias: Tensor, h0: Tensor, c0: Tensor, reverse: bool):
    """One direction over a padded batch, one ``lltm_sequence`` node: (output, h_n, c_n); the
    reverse direction runs the batch flipped in time, and its output is flipped back."""
    output, (h, c) = lltm_sequence(x.flip(0) if reverse else x, weights, bias, (h0, c0))
    return (output.flip(0) if reverse else output), h, c


def _layer_by_layer(x: Tensor, h0, c0, params, directions: int, direction=_padded_direction, between=None):
    """The stack one layer and direction at a time, each a node of its own (differentiable to
    any order): params [(weights, bias)] and h0[i], c0[i] of each layer and direction in
    nn.LSTM's order; ``direction(x, weights, bias, h0, c0, reverse) -> (output, h, c)`` (a
    padded batch's, or a pack's); ``between(x)`` after every layer but the last (dropout).
    -> (output, h_n, c_n)."""
    h_n, c_n = [], []
    layers = len(params) // directions
    for k in range(layers):
        outputs = []
        for d in range(directions):
            i = k * directions + d
            output, h, c = direction(x, *params[i], h0[i], c0[i], reverse=bool(d))
            outputs.append(output)
            h_n.append(h)
            c_n.append(c)
        x = torch.cat(outputs, dim=-1) if directions == 2 else outputs[0]
        if between is not None and k < layers - 1:
            x = between(x)
    return x, torch.stack(h_n), torch.stack(c_n)


# ---- a padded layer's two directions in lockstep: the step loop's route ------------------------
# Where each direction of a bidirectional layer would run the step loop from Python (REPLAYED or
# STEPS: the persistent and fused kernels do not fit), both directions run as one loop: step t of
# the forward direction and step t of the reverse one (the batch flipped in time) at once, one
# batched product over the two directions' weights and one pointwise launch over both
# directions' rows.  The buffers are [T, 2, B, ...]: step t's rows of both directions are one
# contiguous block of 2B rows, and so are those of the step before (its old cells), so the
# cell's kernels take them unchanged and cuBLAS runs a plain strided batch of two.  Replayed
# from CUDA graphs where the sequence's loop would be (graphs.py), each loop over tensors that
# _Padded allocates where they repeat.

def _products_apart(x: Tensor) -> bool:
    """Whether the lockstep loops run a step's product a direction at a time, not as cuBLAS's
    batch of two, and are replayed from CUDA graphs: in float32 on CUDA cores (no TF32).  There
    the batch of two took longer than its two products apart (H100, (B, S) = (64, 768): 45.0 us
    a backward step batched, 15.3 us a direction alone), but the extra launch a step costs host
    time when the loop runs from Python, so the two go together: a 2-layer bidirectional layer's
    fwd+bwd took 0.85x the time at (T, B, I, S) = (200, 64, 128, 768) and 0.87x at
    (100, 64, 256, 1024), where replay alone took 0.97-1.02x and the products apart alone 0.91-1.03x
    (H100, 2026-11-27; benchmarks/NOTES.md)."""
    return x.is_cuda and x.dtype == torch.float32 and not sequence._tensor_core_products(x)


_side_streams: dict = {}  # device index -> the stream a captured lockstep loop runs the reverse direction's products on


def _beside(x: Tensor, apart: bool):
    """Where a lockstep loop with its products apart is being captured into a CUDA graph: the
    side stream of x's device, on which the reverse direction's product of a step runs beside
    the forward direction's (a fork and a join a step, which the graph turns into two parallel
    branches, as cuDNN runs its two directions on two streams); None otherwise (both in turn on
    the current stream: the same products, the same bits)."""
    if not (apart and torch.cuda.is_current_stream_capturing()):
        return None
    index = x.get_device()
    side = _side_streams.get(index)
    if side is None:
        side = _side_streams[index] = torch.cuda.Stream(x.device)
    return side


def _side_by_side(side, first, second) -> None:
    """first() on the current stream and second() on side at the same time, joined after; both
    in turn where side is None."""
    if side is None:
        first()
        second()
        return
    main = torch.cuda.current_stream()
    side.wait_stream(main)
    with torch.cuda.stream(side):
        second()
    first()
    main.wait_stream(side)


def _both_forward_loop(x: Tensor, w_f: Tensor, b_f: Tensor, w_r: Tensor, b_r: Tensor, h0: Tensor, c0: Tensor,
                       output: Tensor, outputs: Tensor, cells: Tensor, gates: Tensor) -> None:
    """Reads x [T, B, I], the two directions' weights and biases, h0 and c0 [2, B, S]; fills
    gates [T, 2, B, 3S], outputs and cells [T, 2, B, S] (the reverse direction's at its own,
    flipped, step t), and output [T, B, 2S] in nn.LSTM's layout."""
    steps, batch, features = x.shape
    state, code = h0.shape[-1], DTYPE_CODES[x.dtype]
    for d, (w, b, inputs) in enumerate(((w_f, b_f, x), (w_r, b_r, x.flip(0)))):
        # the input half of every step, a batch of T products into the strided [T, B, 3S] view
        torch.baddbmm(b, inputs, w[:, state:].t().expand(steps, features, 3 * state), out=gates[:, d])
    w_t = torch.stack((w_f[:, :state], w_r[:, :state])).transpose(1, 2)  # [2, S, 3S]
    h, c = h0, c0
    apart = _products_apart(x)
    side = _beside(x, apart)
    for g, new_h, new_c in zip(gates.unbind(0), outputs.unbind(0), cells.unbind(0)):
        if apart:
            _side_by_side(side, lambda: g[0].addmm_(h[0], w_t[0]), lambda: g[1].addmm_(h[1], w_t[1]))
        else:
            g.baddbmm_(h, w_t)
        _cell_forward_kernel(x, g.data_ptr(), c.data_ptr(), new_h.data_ptr(), new_c.data_ptr(), 2 * batch, state,
                             code)
        h, c = new_h, new_c
    torch.cat((outputs[:, 0], outputs[:, 1].flip(0)), dim=2, out=output)


def _both_backward_loop(grad_output: Tensor, grad_h_n: Tensor, grad_c_n: Tensor, x: Tensor, w_f: Tensor,
                        w_r: Tensor, h0: Tensor, c0: Tensor, outputs: Tensor, cells: Tensor, gates: Tensor,
                        d_x: Tensor, d_w_f: Tensor, d_b_f: Tensor, d_w_r: Tensor, d_b_r: Tensor, d_h0: Tensor,
                        d_c0: Tensor) -> None:
    """_both_forward_loop's gradients: reads grad_output [T, B, 2S], grad_h_n and grad_c_n
    [2, B, S] and the forward's inputs and buffers; fills d_x, each direction's weight and bias
    gradients, d_h0 and d_c0 [2, B, S].  The reverse loop of ``sequence._backward_loop`` over
    both directions' rows at once, then its products over all steps, a direction at a time."""
    steps, batch, _ = x.shape
    state, code = h0.shape[-1], DTYPE_CODES[x.dtype]
    go = torch.stack((grad_output[..., :state], grad_output[..., state:].flip(0)), dim=1)  # [T, 2, B, S]
    go[-1] += grad_h_n  # h_n is each direction's output at its last step
    d_gates = torch.empty_like(gates)
    w_h = torch.stack((w_f[:, :state], w_r[:, :state]))  # [2, 3S, S]
    d_h, d_cell, d_cell_in = torch.empty_like(d_h0), (torch.empty_like(d_c0), torch.empty_like(d_c0)), grad_c_n
    apart = _products_apart(x)
    side = _beside(x, apart)
    for t in range(steps - 1, -1, -1):
        d_cell_out = d_c0 if t == 0 else d_cell[t % 2]  # a kernel's input and output must not overlap
        later = t < steps - 1
        _backward_parts_kernel(x, go[t].data_ptr(), d_h.data_ptr() if later else None, 1 if later else 0,
                               d_cell_in.data_ptr(), gates[t].data_ptr(), (cells[t - 1] if t else c0).data_ptr(),
                               d_gates[t].data_ptr(), d_cell_out.data_ptr(), 2 * batch, state, code)
        if apart:
            target = d_h0 if t == 0 else d_h
            _side_by_side(side, lambda: torch.mm(d_gates[t, 0], w_h[0], out=target[0]),
                          lambda: torch.mm(d_gates[t, 1], w_h[1], out=target[1]))
        else:
            torch.bmm(d_gates[t], w_h, out=d_h0 if t == 0 else d_h)
        d_cell_in = d_cell_out
    # a direction's rows of all steps, contiguous, for the products over all of them
    d_gates, outputs = d_gates.transpose(0, 1).contiguous(), outputs.transpose(0, 1).contiguous()
    d_x_r = torch.empty_like(x)
    for d, (w, d_w, d_b, inputs, d_in) in enumerate(((w_f, d_w_f, d_b_f, x, d_x),
                                                     (w_r, d_w_r, d_b_r, x.flip(0), d_x_r))):
        sequence._gradients_of_all_steps(d_gates[d], inputs, w, h0[d], outputs[d], d_in, d_w, d_b)
    d_x += d_x_r.flip(0)


LOCKSTEP_ROUTES = (sequence.REPLAYED, sequence.STEPS)  # a direction's routes that a padded layer's lockstep replaces
# B*S up to which a layer's two directions in lockstep pay on CUDA, by dtype: one direction's step
# then leaves the GPU idle enough that both in one launch cost less; past it they queue behind
# each other anyway, and full-precision float32's batched products took longer (H100,
# benchmarks/NOTES.md).  A padded layer's lockstep steps are replayed from CUDA graphs (in
# full-precision float32 a direction's product at a time), so only the GPU's time counts; a
# pack's step loop (the library's over cuBLAS, or from Python) is bound by its host time
# wherever the products run on tensor cores, so there it pays at any B*S (_Packed.lockstep).
# Not float64 (not measured).
LOCKSTEP_MAX_WORK = {torch.float16: 1 << 18, torch.bfloat16: 1 << 18, torch.float32: 1 << 16}


class _Padded:
    """How LLTMStackFunction runs a direction of a padded batch [T, B, F]: the calls of
    ``lltm_sequence``'s FUSED route on CUDA, of its ONE_CALL route (the library's loop) on the
    CPU, the reverse direction over the batch flipped in time; or, where each direction would
    run the step loop, a layer's two directions in lockstep (above).  ``inference``: no
    backward follows (the routes of ``sequence._route``)."""

    def __init__(self, directions: int, inference: bool = False):
        self.directions, self.inference = directions, inference
        self.routes = {}  # input width -> LOCKSTEP where a layer of that width took it

    def lockstep(self, x: Tensor, state: int, features: Optional[int] = None) -> bool:
        """Whether a layer of input x (of ``features`` columns, if not x's) runs its two
        directions in lockstep: on CUDA where each would take the step loop (LOCKSTEP_ROUTES) and
        B*S is at most LOCKSTEP_MAX_WORK."""
        steps, batch, width = x.shape
        return self.directions == 2 and x.is_cuda and steps > 0 \
            and batch * state <= LOCKSTEP_MAX_WORK.get(x.dtype, 0) and sequence._route(
                x, steps, batch, width if features is None else features, state, self.inference) in LOCKSTEP_ROUTES

    def takes(self, x: Tensor, state: int, layers: int) -> bool:
        """Whether a bidirectional stack of input x runs as LLTMStackFunction: every layer in
        lockstep, or in training every layer on the fused route (on the CPU: the library's loop)."""
        widths = {x.shape[-1]} if layers == 1 else {x.shape[-1], 2 * state}
        if all(self.lockstep(x, state, width) for width in widths):
            return True
        return not self.inference and _all_fused(x, x.shape[0], x.shape[1], x.shape[-1], state, 2, layers,
                                                 inference=False,
                                                 route=sequence.FUSED if x.is_cuda else sequence.ONE_CALL)

    def _route(self, x: Tensor, state: int, inference: bool) -> str:
        """The route of the lockstep's loops: a direction's (``sequence._route``), except that in
        full-precision float32 a loop that would run from Python (STEPS) is replayed where graphs
        are on (_products_apart)."""
        route = sequence._route(x, *x.shape, state, inference)
        if route is sequence.STEPS and self.directions == 2 and _products_apart(x) and graphs.enabled():
            return sequence.REPLAYED
        return route

    def both_forward(self, x, params, h0, c0):
        """-> (output [T, B, 2S], h_n, c_n [2, B, S], and the buffers the backward reads)."""
        (w_f, b_f), (w_r, b_r) = params
        self.routes[x.shape[-1]] = LOCKSTEP
        steps, batch, _ = x.shape
        state = h0.shape[-1]
        route = self._route(x, state, self.inference)
        with sequence._buffers(x, route):
            output = x.new_empty(steps, batch, 2 * state)
            outputs, cells = x.new_empty(steps, 2, batch, state), x.new_empty(steps, 2, batch, state)
            gates = x.new_empty(steps, 2, batch, 3 * state)
        sequence._run_loop(route, _both_forward_loop, (x, w_f, b_f, w_r, b_r, h0, c0, output, outputs, cells, gates),
                           inputs=7)
        return output, outputs[-1], cells[-1], outputs, cells, gates

    def both_backward(self, grad, grad_h_n, grad_c_n, x, params, h0, c0, outputs, cells, gates):
        """-> (d_x, [d_weights, d_bias of the forward then the reverse direction], d_h0, d_c0 [2, B, S])."""
        (w_f, _), (w_r, _) = params
        route = self._route(x, h0.shape[-1], inference=False)
        with sequence._buffers(x, route):
            grad = grad.contiguous()
            grad_h_n, grad_c_n = (torch.zeros_like(h0) if g is None else g.contiguous() for g in (grad_h_n, grad_c_n))
            d_x, d_w_f, d_w_r = torch.empty_like(x), torch.empty_like(w_f), torch.empty_like(w_r)
            d_b_f, d_b_r, d_h0, d_c0 = x.new_empty(len(w_f)), x.new_empty(len(w_r)), torch.empty_like(h0), \
                torch.empty_like(c0)
        sequence._run_loop(route, _both_backward_loop, (grad, grad_h_n, grad_c_n, x, w_f, w_r, h0, c0, outputs, cells,
                                                        gates, d_x, d_w_f, d_b_f, d_w_r, d_b_r, d_h0, d_c0), inputs=11)
        return d_x, [d_w_f, d_b_f, d_w_r, d_b_r], d_h0, d_c0

    @staticmethod
    def reverse(t: Tensor) -> Tensor:
        return t.flip(0)

    @staticmethod
    def forward(x, weights, bias, h0, c0):
        """-> (output, h_n, c_n, cells, gates)"""
        output, c_n, cells, gates = sequence._forward_whole(sequence._fused_forward_kernel, x, weights, bias, h0, c0) \
            if x.is_cuda else sequence._forward_one_call(x, weights, bias, h0, c0)
        return output, output[-1], c_n, cells, gates

    @staticmethod
    def add_to_last(grad: Tensor, grad_h_n: Tensor) -> None:
        grad[-1] += grad_h_n

    @staticmethod
    def backward(grad, grad_c_n, x, weights, h0, c0, output, cells, gates):
        """-> (d_x, d_weights, d_bias, d_h0, d_c0)"""
        backward = sequence._backward_fused if x.is_cuda else sequence._backward_one_call
        return backward(grad, grad_c_n, x, weights, h0, c0, output, cells, gates)

    direction = staticmethod(_padded_direction)


class _Packed:
    """How LLTMStackFunction runs a direction of a pack's rows [N, F] (``_packed.py``): the fused
    CUDA kernels over its rows, one library call, or the step loop, as
    ``sequence._packed_route`` says for each layer's input width; the reverse direction over
    each sequence reversed within its own length."""

    def __init__(self, directions: int, pack: Pack):
        self.directions, self.pack = directions, pack
        self.routes = {}  # input width -> the route its directions took (the same for both)

    def lockstep(self, x: Tensor, state: int) -> bool:
        """Whether a layer of input x runs its two directions in lockstep (``_packed.both_forward``):
        on CUDA where they would each run the step loop and its products run on tensor cores, so
        that the loop is bound by its host time, which the lockstep halves (one batched product
        and one pointwise launch a step for both); in full-precision float32 where B*S is at most
        LOCKSTEP_MAX_WORK's (past it the products bound the loop, and the batched ones took
        longer: benchmarks/NOTES.md)."""
        return self.directions == 2 and not x.is_cpu \
            and (sequence._tensor_core_products(x) or self.pack.batch * state <= LOCKSTEP_MAX_WORK.get(x.dtype, 0)) \
            and sequence._packed_route(x, self.pack.steps, self.pack.batch, x.shape[1], state) is sequence.STEPS

    def both_forward(self, x, params, h0, c0):
        self.routes[x.shape[1]] = LOCKSTEP  # the route both directions took: the backward's too
        return _packed.both_forward(x, self.pack, params, h0, c0)

    def both_backward(self, grad, grad_h_n, grad_c_n, x, params, h0, c0, outputs, cells, gates):
        return _packed.both_backward(grad, grad_h_n, grad_c_n, x, self.pack, params, h0, c0, outputs, cells, gates)

    def reverse(self, t: Tensor) -> Tensor:
        return t.index_select(0, self.pack.reverse)

    def forward(self, x, weights, bias, h0, c0):
        output, h_n, c_n, cells, gates, self.routes[x.shape[1]] = _packed._forward(x, weights, bias, h0, c0,
                                                                                   self.pack)
        return output, h_n, c_n, cells, gates

    def add_to_last(self, grad: Tensor, grad_h_n: Tensor) -> None:
        grad.index_add_(0, self.pack.last, grad_h_n)

    def backward(self, grad, grad_c_n, x, weights, h0, c0, output, cells, gates):
        return _packed._backward(grad, grad_c_n, x, weights, h0, c0, output, cells, gates, self.pack,
                                 self.routes[x.shape[1]])

    def direction(self, data, weights, bias, h0, c0, reverse: bool):
        """A direction in differentiable torch ops (the double backward's): no autograd
        Function inside the vjp that differentiates it."""
        output, h_n, c_n = _packed._differentiable(self.reverse(data) if reverse else data, weights, bias, h0, c0,
                                                   self.pack)
        return (self.reverse(output) if reverse else output), h_n, c_n


def _stack_forward(x, h0, c0, layout, *params):
    """LLTMStackFunction's forward as it runs from Python: -> (output, h_n, c_n, *saved)."""
    saved, h_n, c_n, directions = [], [], [], layout.directions
    for k in range(len(params) // (2 * directions)):
        if k:
            saved.append(x)
        if layout.lockstep(x, h0.shape[-1]):  # a layer's two directions as one step loop
            i = 2 * k
            x, h, c, *buffers = layout.both_forward(x, (params[2 * i:2 * i + 2], params[2 * i + 2:2 * i + 4]),
                                                    h0[i:i + 2], c0[i:i + 2])
            saved += buffers * 2  # three buffers a direction, as the other routes save: both directions' in each
            h_n += h.unbind(0)
            c_n += c.unbind(0)
            continue
        outputs = []
        for d in range(directions):
            i = k * directions + d
            output, h, c, cells, gates = layout.forward(layout.reverse(x) if d else x, params[2 * i],
                                                        params[2 * i + 1], h0[i], c0[i])
            saved += [output, cells, gates]
            outputs.append(layout.reverse(output) if d else output)
            h_n.append(h)
            c_n.append(c)
        # one direction: a copy, so that no tensor is both a result and a saved buffer
        x = torch.cat(outputs, dim=-1) if directions == 2 else outputs[0].clone()
    return (x, torch.stack(h_n), torch.stack(c_n), *saved)


def _stack_backward(grad_output, grad_h_n, grad_c_n, x, h0, c0, layout, params, saved):
    """LLTMStackFunction's backward as it runs from Python, no graph of the gradient:
    -> (d_x, [d_weights, d_bias of each layer and direction], d_h0, d_c0)."""
    directions = layout.directions
    layers, state = len(params) // (2 * directions), h0.shape[-1]
    grads, d_h0, d_c0 = [None] * len(params), [None] * len(h0), [None] * len(c0)
    per_layer = 3 * directions + 1  # each layer's saved buffers: its input (past the first), then 3 a direction
    for k in range(layers - 1, -1, -1):
        first = k * per_layer - (1 if k else 0)
        layer_input = saved[first] if k else x
        if grad_output is None:
            grad_output = layer_input.new_zeros(*layer_input.shape[:-1], directions * state)
        if directions == 2 and layout.routes.get(layer_input.shape[-1]) is LOCKSTEP:
            i = 2 * k
            outputs, cells, gates = saved[first + (1 if k else 0):][:3]
            grad_output, grads[2 * i:2 * i + 4], (d_h0[i], d_h0[i + 1]), (d_c0[i], d_c0[i + 1]) = \
                layout.both_backward(grad_output, None if grad_h_n is None else grad_h_n[i:i + 2],
                                     None if grad_c_n is None else grad_c_n[i:i + 2], layer_input,
                                     (params[2 * i:2 * i + 2], params[2 * i + 2:2 * i + 4]),
                                     h0[i:i + 2], c0[i:i + 2], outputs, cells, gates)
            continue
        d_input = None
        for d in range(directions):
            i = k * directions + d
            output, cells, gates = saved[first + (1 if k else 0) + 3 * d:][:3]
            grad = grad_output[..., d * state:(d + 1) * state]  # copied: h_n's gradient is added in place
            grad = layout.reverse(grad) if d else grad.clone(memory_format=torch.contiguous_format)
            if grad_h_n is not None:
                layout.add_to_last(grad, grad_h_n[i])
            d_x, grads[2 * i], grads[2 * i + 1], d_h0[i], d_c0[i] = layout.backward(
                grad, None if grad_c_n is None else grad_c_n[i].contiguous(),
                layout.reverse(layer_input) if d else layer_input, params[2 * i], h0[i], c0[i], output, cells,
                gates)
            d_x = layout.reverse(d_x) if d else d_x
            d_input = d_x if d_input is None else d_input + d_x
        grad_output = d_input
    return grad_output, grads, torch.stack(d_h0), torch.stack(d_c0)


# A padded bidirectional stack on the fused kernels is bound by host time: from Python its
# forward+backward launches ~30 ops a layer (the flips of the reverse direction, the gradients'
# slices, the kernels' calls), each costing more than its GPU work.  Where graphs are on, each
# of its forward and backward runs as a loop of graphs.run, over tensors the call allocates in
# graphs.buffers: the same call again (a training loop's) replays one CUDA graph.
_STACK = _Padded(2)  # the layout the replayed loops run (fused: no route is ever recorded in it)
_stack_loops: dict = {}  # (forward?, layers, which gradients are given) -> the loop (one object each: graphs' key)


def _replays_stack(layout, x: Tensor, h0: Tensor, c0: Tensor, params) -> bool:
    """Whether a stack's forward and backward run as replayed loops (above): a padded batch on
    CUDA whose layers take the fused kernels (not in lockstep), graphs on, no capture under way,
    its tensors contiguous (a graph's key holds addresses and shapes, not strides)."""
    return type(layout) is _Padded and x.is_cuda and not layout.inference and graphs.enabled() \
        and not torch.cuda.is_current_stream_capturing() and not layout.lockstep(x, h0.shape[-1]) \
        and all(t.is_contiguous() for t in (x, h0, c0, *params))


def _stack_loop(forward: bool, layers: int, given: tuple = ()):
    key = (forward, layers, given)
    loop = _stack_loops.get(key)
    if loop is None:
        loop = _stack_loops[key] = functools.partial(_forward_loop if forward else _backward_loop, layers, given)
    return loop


def _forward_loop(layers: int, given: tuple, x, h0, c0, *rest) -> None:
    """_stack_forward's results written into rest[4L:] (output, h_n, c_n, the saved buffers)."""
    for out, result in zip(rest[4 * layers:], _stack_forward(x, h0, c0, _STACK, *rest[:4 * layers])):
        out.copy_(result)


def _replayed_forward(x, h0, c0, params):
    steps, batch, _ = x.shape
    state, layers = h0.shape[-1], len(params) // 4
    with graphs.buffers(x):
        shapes = [(steps, batch, 2 * state), (2 * layers, batch, state), (2 * layers, batch, state)]
        for k in range(layers):
            shapes += ([(steps, batch, 2 * state)] if k else []) + [(steps, batch, state), (steps, batch, state),
                                                                   (steps, batch, 3 * state)] * 2
        results = [x.new_empty(shape) for shape in shapes]
    graphs.run(_stack_loop(True, layers), (x, h0, c0, *params, *results), inputs=3 + len(params), copies_pay=False)
    return tuple(results)


def _backward_loop(layers: int, given: tuple, *tensors) -> None:
    """_stack_backward's results written into the last 3 + 4L tensors (d_x, the parameters'
    gradients, d_h0, d_c0); ``given``: which of grad_output, grad_h_n, grad_c_n lead the tensors."""
    rest = list(tensors)
    grad_output, grad_h_n, grad_c_n = (rest.pop(0) if g else None for g in given)
    x, h0, c0, *rest = rest
    params, saved, outs = rest[:4 * layers], rest[4 * layers:11 * layers - 1], rest[11 * layers - 1:]
    d_x, grads, d_h0, d_c0 = _stack_backward(grad_output, grad_h_n, grad_c_n, x, h0, c0, _STACK, params, saved)
    for out, result in zip(outs, (d_x, *grads, d_h0, d_c0)):
        out.copy_(result)


def _replayed_backward(grad_output, grad_h_n, grad_c_n, x, h0, c0, params, saved):
    given = tuple(g is not None for g in (grad_output, grad_h_n, grad_c_n))
    with graphs.buffers(x):
        # contiguous (the graph's key holds addresses and shapes, not strides): a sum's gradient
        # is an expanded scalar
        grads_in = [g.contiguous() for g in (grad_output, grad_h_n, grad_c_n) if g is not None]
        outs = [torch.empty_like(t) for t in (x, *params, h0, c0)]
    graphs.run(_stack_loop(False, len(params) // 4, given), (*grads_in, x, h0, c0, *params, *saved, *outs),
               inputs=len(grads_in) + 3 + len(params) + len(saved), copies_pay=False)
    return outs[0], outs[1:-2], outs[-2], outs[-1]


class LLTMStackFunction(torch.autograd.Function):
    """A stack's training as one autograd node: a bidirectional padded batch where the fused
    CUDA kernels (on the CPU: the library loop) take every layer or every layer runs its
    directions in lockstep, or a pack on any device (``LLTMLayer`` picks it, in inference too,
    where ``apply`` records no node).  Each
    direction's forward and backward are the calls a layer-by-layer node would make (``layout``:
    ``_Padded`` or ``_Packed``), the same bits, but where a layer runs its two directions as one
    step loop (``layout.lockstep``: its batched products round otherwise); one
    node and its own buffers instead of a node per direction and the flips, concatenations and
    stacks between them (0.72-0.80x the time of a 2-layer bidirectional layer's fwd+bwd at small
    sizes on an H100, padded; benchmarks/NOTES.md).

    ``apply(x, h0, c0, layout, *params) -> (output, h_n, c_n, *saved)``: x [T, B, I] (a pack:
    its rows [N, I]), h0 and c0 [L*D, B, S], params (weights, bias) per layer and direction;
    ``saved`` are the buffers the backward reads (each layer's input past the first, each
    direction's output, cells and gates), not differentiable.  Double backward (torch.func's
    too) is the vjp of the layer-by-layer path through torch.func."""

    @staticmethod
    def forward(x, h0, c0, layout, *params):
        if _replays_stack(layout, x, h0, c0, params):
            return _replayed_forward(x, h0, c0, params)
        return _stack_forward(x, h0, c0, layout, *params)

    @staticmethod
    def setup_context(ctx, inputs, outputs) -> None:
        x, h0, c0, ctx.layout, *params = inputs
        ctx.mark_non_differentiable(*outputs[3:])
        ctx.set_materialize_grads(False)
        ctx.params = len(params)
        ctx.save_for_backward(x, h0, c0, *params, *outputs[3:])

    @staticmethod
    def backward(ctx, grad_output, grad_h_n, grad_c_n, *_):
        x, h0, c0, *rest = ctx.saved_tensors
        params, saved, layout = rest[:ctx.params], rest[ctx.params:], ctx.layout
        directions = layout.directions
        needs = ctx.needs_input_grad[:3] + ctx.needs_input_grad[4:]
        if torch.is_grad_enabled():  # a graph of the gradient: the vjp of the layer-by-layer path
            def stack(x, h0, c0, *params):  # through torch.func, which composes with transforms around it
                return _layer_by_layer(x, h0, c0, list(zip(params[::2], params[1::2])), directions,
                                       layout.direction)
            results, pullback = torch.func.vjp(stack, x, h0, c0, *params)
            got = pullback(tuple(torch.zeros_like(r) if g is None else g
                                 for r, g in zip(results, (grad_output, grad_h_n, grad_c_n))))
            got = [g if need else None for g, need in zip(got, needs)]
            return (*got[:3], None, *got[3:])
        if _replays_stack(layout, x, h0, c0, params) and not layout.routes:
            grad_output, grads, d_h0, d_c0 = _replayed_backward(grad_output, grad_h_n, grad_c_n, x, h0, c0, params,
                                                                saved)
        else:
            grad_output, grads, d_h0, d_c0 = _stack_backward(grad_output, grad_h_n, grad_c_n, x, h0, c0, layout,
                                                             params, saved)
        return (grad_output if needs[0] else None, d_h0 if needs[1] else None, d_c0 if needs[2] else None, None,
                *(g if need else None for g, need in zip(grads, needs[3:])))

    @staticmethod
    def vmap(info, in_dims, x, h0, c0, layout, *params):
        """One stack per index of the vmapped dimension."""
        def at(t, dim, i):
            return t if dim is None else t.select(dim, i)

        outs = [LLTMStackFunction.apply(at(x, in_dims[0], i), at(h0, in_dims[1], i), at(c0, in_dims[2], i),
                                        layout, *(at(p, dim, i) for p, dim in zip(params, in_dims[4:])))
                for i in range(info.batch_size)]
        results = tuple(torch.stack(o) for o in zip(*outs))
        return results, (0,) * len(results)


class LLTMLayer(torch.nn.Module):
    """The LLTM cell over whole sequences, as ``nn.LSTM`` is the LSTM's:
    ``forward(input, state=None) -> (output, (h_n, c_n))``.

    ``LLTMLayer(input_features, state_size, num_layers=1, bias=True, batch_first=False,
    dropout=0.0, bidirectional=False, device=None, dtype=None)``.  input [T, B, I] ([B, T, I]
    with ``batch_first``) or unbatched [T, I]; state (h0, c0), each [L*D, B, S] ([L*D, S]
    unbatched; L = num_layers, D = 2 if bidirectional else 1), zeros when omitted; output
    [T, B, D*S] (batch_first: [B, T, D*S]), h_n and c_n [L*D, B, S], the layers' last states
    in nn.LSTM's order (layer 0 forward, layer 0 reverse, layer 1 forward, ...).  Parameters
    ``weights_l{k}`` [3S, S + I_k] and ``bias_l{k}`` [3S] (``_reverse`` for the reverse
    direction; no biases with bias=False), initialised uniform in +-1/sqrt(S) as ``LLTM``'s.
    A checkpoint of an ``LLTM`` cell, or of an ``LLTMLayer`` of 0.4.0 and before (``weights``,
    ``bias``), loads into a one-layer, one-direction layer, and such a layer's into a cell.
    Deprecated, for one release: ``weights`` and ``bias`` (use ``weights_l0``, ``bias_l0``), and
    a state of [B, S] tensors (0.4.0's; then h_n and c_n come back as [B, S] too).  A
    ``PackedSequence`` input (sorted or not) gives a ``PackedSequence`` output with the input's
    ``sorted_indices``, each sequence run exactly its own length (h_n, c_n: the state at its own
    last step; the reverse direction starts at it), no padding computed."""

    def __init__(self, input_features: int, state_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, device=None,
                 dtype=None):
        super().__init__()
        for name, value, low in (("input_features", input_features, 0), ("state_size", state_size, 1),
                                 ("num_layers", num_layers, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout <= 1:
            raise ValueError(f"dropout must be a number in [0, 1], got {dropout!r}")
        if dropout > 0 and num_layers == 1:
            warnings.warn("dropout acts between layers: with num_layers=1 it has no effect (as in nn.LSTM)",
                          UserWarning, stacklevel=2)
        self.input_features, self.state_size, self.num_layers = input_features, state_size, num_layers
        self.has_bias, self.batch_first, self.dropout = bool(bias), batch_first, float(dropout)
        self.bidirectional = bool(bidirectional)
        factory = {"device": device, "dtype": dtype}
        for name, width in self._parameter_shapes():
            self.register_parameter(f"weights{name}", torch.nn.Parameter(
                torch.empty(3 * state_size, state_size + width, **factory)))
            if self.has_bias:
                self.register_parameter(f"bias{name}", torch.nn.Parameter(torch.empty(3 * state_size, **factory)))
        self.reset_parameters()

    def _parameter_shapes(self) -> List[Tuple[str, int]]:
        """(suffix, input width) of each layer and direction, in nn.LSTM's order."""
        directions = 2 if self.bidirectional else 1
        return [(f"_l{k}{'_reverse' if d else ''}", self.input_features if k == 0 else directions * self.state_size)
                for k in range(self.num_layers) for d in range(directions)]

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.state_size)
        with torch.no_grad():
            for weight in self.parameters():
                weight.uniform_(-stdv, +stdv)

    def __getattr__(self, name: str):
        # Deprecated (0.4.0 and before): ``weights`` and ``bias``, for ``weights_l0`` and
        # ``bias_l0`` (None with bias=False; the flag is ``has_bias``).  Looked up here, where
        # nn.Module finds parameters, rather than as properties, which tools that scan a
        # module's attributes (torch.jit.trace) would trip over.
        if name in ("weights", "bias"):
            warnings.warn(f"LLTMLayer.{name} is deprecated: use LLTMLayer.{name}_l0", DeprecationWarning,
                          stacklevel=2)
            if name == "bias" and not self.has_bias:
                return None
            return super().__getattr__(f"{name}_l0")
        return super().__getattr__(name)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # a cell's or a 0.4.0 layer's checkpoint: ``weights`` and ``bias`` are layer 0's
        for old, new in (("weights", "weights_l0"), ("bias", "bias_l0")):
            if prefix + old in state_dict and prefix + new not in state_dict:
                state_dict[prefix + new] = state_dict.pop(prefix + old)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def forward(self, input: Tensor, state: Optional[Tuple[Tensor, Tensor]] = None):
        if isinstance(input, PackedSequence):
            return self._forward_packed(input, state)
        if not isinstance(input, Tensor) or input.dim() not in (2, 3):
            raise ValueError(f"input must be a 3-D tensor [{'B, T' if self.batch_first else 'T, B'}, "
                             f"input_features] or an unbatched 2-D one [T, input_features], got "
                             f"{type(input).__name__ if not isinstance(input, Tensor) else list(input.shape)}")
        batched = input.dim() == 3
        x = input if batched else input.unsqueeze(1)
        if batched and self.batch_first:
            x = x.transpose(0, 1)
        directions = 2 if self.bidirectional else 1
        layers = self.num_layers * directions
        batch = x.shape[1]
        legacy = False  # 0.4.0's state: (h0, c0) each [B, S], returned so (one layer, one direction)
        if (state is not None and batched and layers == 1 and isinstance(state, (tuple, list)) and len(state) == 2
                and all(isinstance(t, Tensor) and t.dim() == 2 for t in state)):
            warnings.warn("LLTMLayer's state is [num_layers*num_directions, batch, state_size], as nn.LSTM's: "
                          "a [batch, state_size] state is deprecated (pass h0.unsqueeze(0), c0.unsqueeze(0))",
                          DeprecationWarning, stacklevel=2)
            state, legacy = tuple(t.unsqueeze(0) for t in state), True
        if state is not None:
            state = self._check_state(state, layers, batch, batched)
        inference = self._no_gradient_wanted(x, state)
        x, h_n, c_n = (inference and self._inference_stack(x, x.shape[0], batch, state)) or \
            self._layers(x, batch, state, inference=inference)
        if legacy:
            h_n, c_n = h_n[0], c_n[0]
        if not batched:
            return x.squeeze(1), (h_n.squeeze(1), c_n.squeeze(1))
        return (x.transpose(0, 1) if self.batch_first else x), (h_n, c_n)

    def _forward_packed(self, packed: PackedSequence, state):
        """A PackedSequence: each sequence runs exactly its own length, no padding computed
        (``_packed.py``)."""
        data, batch_sizes, sorted_indices, unsorted_indices = packed
        pack = Pack(batch_sizes, data.device)
        if not isinstance(data, Tensor) or data.dim() != 2 or data.shape[0] != pack.rows \
                or data.shape[1] != self.input_features:
            raise ValueError(f"input (a PackedSequence) must hold data [sum(batch_sizes), input_features] = "
                             f"[{pack.rows}, {self.input_features}], got "
                             f"{list(data.shape) if isinstance(data, Tensor) else type(data).__name__}")
        if state is not None:
            state = self._check_state(state, self.num_layers * (2 if self.bidirectional else 1), pack.batch, True)
        # the states in the caller's order: the stack op reads and writes them so, else permuted here
        order = None if sorted_indices is None else sorted_indices.to(data.device)
        inference = self._no_gradient_wanted(data, state)
        result = self._inference_stack(data, pack.steps, pack.batch, state, pack, order) if inference else None
        if result is None:
            if order is not None and state is not None:
                state = [t.index_select(1, order) for t in state]
            result = self._layers(data, pack.batch, state, pack, inference=inference)
            if unsorted_indices is not None:
                back = unsorted_indices.to(data.device)
                result = (result[0], result[1].index_select(1, back), result[2].index_select(1, back))
        x, h_n, c_n = result
        return PackedSequence(x, batch_sizes, sorted_indices, unsorted_indices), (h_n, c_n)

    def _no_gradient_wanted(self, x: Tensor, state) -> bool:
        """Whether this call runs without autograd (no gradient wanted, and a torch that can call
        the ops directly): then the stack op where it takes every layer, never the training node."""
        return DIRECT_WITHOUT_GRAD and no_gradient_wanted(itertools.chain((x,), self.parameters(), state or ()))

    def _layers(self, x: Tensor, batch: int, state, pack: Optional[Pack] = None, inference: bool = False):
        """Every layer and direction over x, a padded batch [T, B, features] or, with its Pack, a
        pack's data [N, features]; state checked, or None; ``inference``: _no_gradient_wanted's
        answer.  -> (output, h_n, c_n), the output shaped as x with D*S features."""
        directions = 2 if self.bidirectional else 1
        if x.shape[0] and not (self.dropout > 0 and self.training and self.num_layers > 1) \
                and not (torch.compiler.is_compiling() or torch.jit.is_tracing() or exporting()) \
                and (pack is not None or self.bidirectional):
            trained = self._stack_training(x, batch, state, pack, inference)
            if trained is not None:
                return trained
        layers = self.num_layers * directions
        if state is None:  # zeros, shared by every layer and direction (each only reads them)
            state = ([x.new_zeros(batch, self.state_size)] * layers, [x.new_zeros(batch, self.state_size)] * layers)
        direction = _padded_direction if pack is None else \
            (lambda data, *args, reverse: packed_direction(data, pack, *args, reverse=reverse))
        between = functools.partial(F.dropout, p=self.dropout, training=True) \
            if self.dropout > 0 and self.training else None
        return _layer_by_layer(x, *state, self._direction_parameters(), directions, direction, between)

    def _direction_parameters(self) -> List[Tuple[Tensor, Tensor]]:
        """(weights, bias) of each layer and direction in nn.LSTM's order (zeros with bias=False)."""
        def get(name):  # the registered parameter, else what the attribute is (a parametrization's)
            value = own.get(name)
            return value if value is not None else getattr(self, name)

        params, own = [], self._parameters
        for suffix, _ in self._parameter_shapes():
            weights = get(f"weights{suffix}")
            params.append((weights, get(f"bias{suffix}") if self.has_bias else weights.new_zeros(3 * self.state_size)))
        return params

    def _stack_training(self, x: Tensor, batch: int, state, pack: Optional[Pack] = None, inference: bool = False):
        """_layers in training, packed, or padded and bidirectional where every layer takes the
        fused route or runs its directions in lockstep (``_Padded.takes``): one autograd node for
        the stack (LLTMStackFunction); inference: the same Function, which records no node there.
        None where a padded stack takes neither, the arguments are not all of x's dtype and device,
        the parameters not of their shapes, or a tangent is carried (the layer-by-layer path then
        runs: it raises, naming the argument, or computes forward mode in torch ops)."""
        check_tensor("input", x)  # raises for bad input, naming it, as the layer-by-layer path does
        layout = _Padded(2, inference) if pack is None else _Packed(2 if self.bidirectional else 1, pack)
        if pack is None and not layout.takes(autocast_cast((x,))[0], self.state_size, self.num_layers):
            return None
        shapes = self._parameter_shapes()
        params = [t for pair in self._direction_parameters() for t in pair]
        if state is None:
            state = (x.new_zeros(len(shapes), batch, self.state_size), x.new_zeros(len(shapes), batch, self.state_size))
        x, h0, c0, *params = autocast_cast((x, *state, *params))
        s = self.state_size
        expected = [shape for _, width in shapes for shape in ((3 * s, s + width), (3 * s,))]
        if not all(isinstance(t, Tensor) and t.dtype == x.dtype and t.device == x.device for t in (h0, c0, *params)) \
                or any(p.shape != shape for p, shape in zip(params, expected)) or has_tangent((x, h0, c0, *params)):
            return None
        # inference too through apply, which records no node where no gradient is wanted: under
        # torch.func.vmap the Function's vmap rule runs it (its forward would meet batched tensors)
        output, h_n, c_n, *_ = LLTMStackFunction.apply(x.contiguous(), h0.contiguous(), c0.contiguous(), layout,
                                                       *(p.contiguous() for p in params))
        return output, h_n, c_n

    def _inference_stack(self, x: Tensor, steps: int, batch: int, state, pack: Optional[Pack] = None,
                         order: Optional[Tensor] = None):
        """Called where no gradient is wanted (_no_gradient_wanted): where the fused CUDA kernels
        (on the CPU: its library loop, padded only) take every layer, the whole stack as one op
        (above): (output, h_n, c_n), a pack's states in the caller's order (``order``: its
        sorted_indices); else None."""
        if not steps or (self.dropout > 0 and self.training and self.num_layers > 1):
            return None
        directions = 2 if self.bidirectional else 1
        if not (_all_fused(x, steps, batch, self.input_features, self.state_size, directions, self.num_layers)
                if x.is_cuda else pack is None and _all_fused(x, steps, batch, self.input_features, self.state_size,
                                                              directions, self.num_layers, route=sequence.ONE_CALL)):
            return None
        weights, bias = zip(*self._direction_parameters())
        x, *weights = autocast_cast((x, *weights))
        bias = list(autocast_cast(bias))
        h0, c0 = (None, None) if state is None else autocast_cast(tuple(state))
        return torch.ops.pyroundlib.lltm_layers_inference.default(
            x, weights, bias, h0, c0, directions, *(() if pack is None else (pack.first, pack.lengths, order)))

    def _check_state(self, state, layers: int, batch: int, batched: bool):
        if not (isinstance(state, (tuple, list)) and len(state) == 2):
            raise TypeError(f"state must be a tuple (h0, c0) or None, got {type(state).__name__}")
        want = [layers, batch, self.state_size] if batched else [layers, self.state_size]
        checked = []
        for name, t in zip(("h0", "c0"), state):
            if not isinstance(t, Tensor):
                raise TypeError(f"state's {name} must be a Tensor, got {type(t).__name__}")
            if list(t.shape) != want:
                raise ValueError(f"state's {name} must be [num_layers*num_directions, batch, state_size]"
                                 f"{'' if batched else ' without the batch (unbatched input)'} = {want}, "
                                 f"got {list(t.shape)}")
            checked.append(t if batched else t.unsqueeze(1))
        return checked

    def extra_repr(self) -> str:
        text = f"input_features={self.input_features}, state_size={self.state_size}"
        for name, attr, default in (("num_layers", "num_layers", 1), ("bias", "has_bias", True),
                                    ("batch_first", "batch_first", False), ("dropout", "dropout", 0.0),
                                    ("bidirectional", "bidirectional", False)):
            if getattr(self, attr) != default:
                text += f", {name}={getattr(self, attr)}"
        return text

