"""The LLTM over a packed batch, every sequence run exactly its own steps: each direction of a
layer is one autograd node whose recurrence is, as ``sequence._packed_route`` says, the fused
CUDA kernels over the pack's rows (short packs of small states: prl_lltm_packed_fused_*, the
input half and every product included), one library call (prl_lltm_sequence_packed_forward_* /
_backward_*: the CPU loop, and CUDA's persistent kernels where they fit), or the step loop over
each step's rows (``_forward_steps``, ``_backward_steps``; on CUDA run by the library, each product
by torch's cuBLAS: ``_cublas``, prl_lltm_packed_steps_*; else from Python over torch's GEMMs);
where that loop is bound by its host time (its products on tensor cores, or small:
``layer._Packed.lockstep``), a bidirectional layer's two directions as one step loop
(``both_forward``, ``both_backward``: one batched product and one pointwise launch a step for
both).

A ``PackedSequence``'s data hold step t's rows after those of the steps before it, its
sequences sorted longest first, so step t has the first ``batch_sizes[t]`` rows of the batch.
The library's sequence loop takes those sizes and computes no padding; ``Pack`` holds what
every layer and direction of one call shares: the sizes, where each sequence's last step is,
and the permutation that runs each sequence backwards in time (the reverse direction is the
forward direction over the sequences reversed, each within its own length, so it too starts
each sequence at its own last step).  On CUDA the sizes reach the device through the library's
``prl_upload_cuda`` (kernel parameters, in stream order) and the row indices are formed there:
nothing waits for the GPU, and a CUDA graph that captures a call replays the same pack.

``PackedLLTMFunction``: one direction as one autograd node (where no gradient is wanted,
the same forward runs without it: 0.89-0.90x the time of a 2-layer bidirectional layer's
inference at (8, 32, 8, 64) on an H100 and its 16-core Xeon, benchmarks/NOTES.md).  The input
half of every step is one GEMM over all rows, then the recurrence; backward, the reverse
recurrence and the input, weight and bias gradients as three products over all rows.  When a
graph of the gradient is being built (double backward), the backward differentiates the same
recurrence written in torch ops (``_differentiable``) instead.
"""
from __future__ import annotations

import ctypes
import functools
import itertools

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _cublas, sequence
from ._common import DTYPE_CODES, Kernel, autocast_cast, check_like, check_tensor, no_gradient_wanted, ptr
from .lltm import _forward_kernel as _cell_forward_kernel, _pointwise_differentiable
from .sequence import _backward_parts_kernel

_forward_kernel = Kernel("lltm_sequence_packed_forward")
_backward_kernel = Kernel("lltm_sequence_packed_backward")
_upload_kernel = Kernel("upload", cpu=False)
_steps_forward_kernel = Kernel("lltm_packed_steps_forward", cpu=False)
_steps_backward_kernel = Kernel("lltm_packed_steps_backward", cpu=False)


class Pack:
    """A sorted pack's step sizes and the row indices of its data that its layers share, on the
    data's device.  What every call needs is formed on the host from the sizes (checked there) and
    reaches the device in one upload on first use (``sizes``; ``first``, the row of each step's
    first sequence; ``lengths``, each sequence's steps; ``last``, each sequence's last row); the
    rest on first use too (inference needs no ``previous``, one direction no ``reverse``).  First
    use is inside the autograd node that reads them: under a torch.func transform a tensor made
    in the transformed function is the transform's (no storage to hand the library), one made in
    the node's forward is not."""

    def __init__(self, batch_sizes: Tensor, device: torch.device):
        try:
            sizes = [int(size) for size in batch_sizes.tolist()]
        except RuntimeError:  # torch 2.4 inside a torch.func transform: tolist() refuses any tensor
            sizes = [int(size) for size in batch_sizes]  # (a step at a time: only there)
        self.host_sizes = sizes
        if any(b > a for a, b in zip(sizes, sizes[1:])) or min(sizes, default=1) < 1:
            raise ValueError(f"batch_sizes must not grow and stay >= 1 (a PackedSequence's), got {sizes}")
        self.steps, self.rows = len(sizes), sum(sizes)
        self.batch = sizes[0] if self.steps else 0
        self.device = device

    @functools.cached_property
    def _table(self):
        """(sizes, first, lengths, last) on the device."""
        sizes = self.host_sizes
        first = list(itertools.accumulate(sizes[:-1], initial=0)) if self.steps else []
        ends = [0] * self.batch  # ends[b]: how many steps have exactly b + 1 rows
        for size in sizes:
            ends[size - 1] += 1
        lengths = list(itertools.accumulate(reversed(ends)))[::-1]  # how many steps have more than b rows
        last = [first[n - 1] + b for b, n in enumerate(lengths)]
        table = torch.tensor(sizes + first + lengths + last, dtype=torch.int64)  # what the library reads
        if self.device.type == "cuda":
            host, table = table, torch.empty(len(table), dtype=torch.int64, device=self.device)
            if len(table):
                _upload_kernel(table, table.data_ptr(), host.data_ptr(), len(table))
        return table.split([self.steps] * 2 + [self.batch] * 2)

    @functools.cached_property
    def host_array(self):
        """The sizes as a C array (int64_t[steps]) in host memory: what the library's step
        loops read (``_cublas``)."""
        return (ctypes.c_int64 * self.steps)(*self.host_sizes)

    sizes = property(lambda self: self._table[0])
    first = property(lambda self: self._table[1])
    lengths = property(lambda self: self._table[2])
    last = property(lambda self: self._table[3])

    def _arange(self, n: int) -> Tensor:
        return torch.arange(n, device=self.device)

    @functools.cached_property
    def _rows(self):
        """(step, sequence) of each row."""
        step = torch.repeat_interleave(self._arange(self.steps), self.sizes, output_size=self.rows)
        return step, self._arange(self.rows) - self.first[step]

    @functools.cached_property
    def reverse(self) -> Tensor:
        """Row (t, b) <-> row (length_b - 1 - t, b): each sequence reversed in time."""
        step, seq = self._rows
        return self.first[self.lengths[seq] - 1 - step] + seq

    @functools.cached_property
    def previous(self) -> Tensor:
        """The row of h_{t-1} in cat([h0, data rows]): h0's for t = 0."""
        step, seq = self._rows
        return torch.where(step == 0, seq, self.batch + self.first[(step - 1).clamp(min=0)] + seq)


def packed_direction(data: Tensor, pack: Pack, weights: Tensor, bias: Tensor, h0: Tensor, c0: Tensor,
                     reverse: bool):
    """One direction over a pack's data [N, I]: (output [N, S], h_n, c_n [B, S])."""
    data, weights, bias, h0, c0 = autocast_cast((data, weights, bias, h0, c0))
    check_tensor("input", data)  # raises for bad input, naming it, before any pointer reaches C
    for name, value in (("weights", weights), ("bias", bias), ("h0", h0), ("c0", c0)):
        check_like(name, value, "input", data)
    if reverse:
        data = data.index_select(0, pack.reverse)
    # no autograd node where grad mode is off (inference): none is wanted.  With grad mode on the
    # Function runs even where no input requires grad: under a torch.func transform its inputs
    # may be the transform's tensors, which only a Function (or an op) hands over unwrapped.
    if not torch.is_grad_enabled() and no_gradient_wanted((data, weights, bias, h0, c0)):
        output, h_n, c_n, *_ = _forward(data, weights, bias, h0, c0, pack)
    else:
        output, h_n, c_n, *_ = PackedLLTMFunction.apply(data, weights, bias, h0, c0, pack)
    return (output.index_select(0, pack.reverse) if reverse else output), h_n, c_n


def _forward(data, weights, bias, h0, c0, pack):
    """One direction's forward over the pack: (output, h_n, c_n, cells, gates, the route it took:
    ``sequence._packed_route``)."""
    data, weights, bias, h0, c0 = (t.contiguous() for t in (data, weights, bias, h0, c0))
    state, features = h0.shape[1], data.shape[1]
    route = sequence._packed_route(data, pack.steps, pack.batch, features, state)
    output, cells, c_n = data.new_empty(len(data), state), data.new_empty(len(data), state), torch.empty_like(c0)
    if route is sequence.FUSED:  # the whole forward, input half included, in one launch over the pack's rows
        gates = data.new_empty(len(data), 3 * state)
        sequence._packed_fused_forward_kernel(
            data, data.data_ptr(), weights.data_ptr(), bias.data_ptr(), h0.data_ptr(), c0.data_ptr(),
            pack.first.data_ptr(), pack.lengths.data_ptr(), output.data_ptr(), cells.data_ptr(), gates.data_ptr(),
            c_n.data_ptr(), pack.steps, pack.batch, pack.rows, features, state, DTYPE_CODES[data.dtype])
    elif route is sequence.ONE_CALL:
        gates = sequence.input_half(data, weights, bias, state)  # the input half of every row
        _forward_kernel(data, gates.data_ptr(), weights.data_ptr(), state + features, h0.data_ptr(),
                        c0.data_ptr(), output.data_ptr(), cells.data_ptr(), c_n.data_ptr(), pack.sizes.data_ptr(),
                        pack.steps, pack.batch, state, DTYPE_CODES[data.dtype])
    else:
        gates = sequence.input_half(data, weights, bias, state)
        _forward_steps(gates, weights[:, :state], h0, c0, output, cells, pack)
        torch.index_select(cells, 0, pack.last, out=c_n)
    return output, output.index_select(0, pack.last), c_n, cells, gates, route


class PackedLLTMFunction(torch.autograd.Function):
    """``apply(data, weights, bias, h0, c0, pack) -> (output, h_n, c_n, cells, gates)``: one
    direction over a pack's rows; cells and gates are the buffers the backward reads, not
    differentiable.  Written the way torch.func needs (``setup_context``)."""

    @staticmethod
    def forward(data, weights, bias, h0, c0, pack):
        output, h_n, c_n, cells, gates, _ = _forward(data, weights, bias, h0, c0, pack)
        return output, h_n, c_n, cells, gates

    @staticmethod
    def setup_context(ctx, inputs, outputs) -> None:
        data, weights, bias, h0, c0, ctx.pack = inputs
        output, _, _, cells, gates = outputs
        ctx.mark_non_differentiable(cells, gates)
        ctx.set_materialize_grads(False)
        # the route _forward took
        ctx.route = sequence._packed_route(data, ctx.pack.steps, ctx.pack.batch, data.shape[1], h0.shape[1])
        ctx.save_for_backward(data, weights, bias, h0, c0, output, cells, gates)

    @staticmethod
    def backward(ctx, grad_output, grad_h_n, grad_c_n, *_):
        data, weights, bias, h0, c0, output, cells, gates = ctx.saved_tensors
        if torch.is_grad_enabled():  # double backward: differentiate the recurrence in torch ops
            return _differentiable_backward(ctx, (data, weights, bias, h0, c0), (grad_output, grad_h_n, grad_c_n))
        grad_output = torch.zeros_like(output) if grad_output is None else grad_output.contiguous()
        if grad_h_n is not None:  # h_n is each sequence's output row at its last step
            grad_output = grad_output.index_add(0, ctx.pack.last, grad_h_n)
        return (*_backward(grad_output, grad_c_n, data, weights, h0, c0, output, cells, gates, ctx.pack,
                           ctx.route), None)


def _backward(grad_output, grad_c_n, data, weights, h0, c0, output, cells, gates, pack, route: str):
    """One direction's gradients (d_data, d_weights, d_bias, d_h0, d_c0) from _forward's
    buffers; grad_output [N, S] (h_n's gradient already added at each sequence's last row),
    grad_c_n [B, S] or None (zero).  route: the one _forward took."""
    state = h0.shape[1]
    d_gates, d_h0, d_c0 = torch.empty_like(gates), torch.empty_like(h0), torch.empty_like(c0)
    grad_c_n = None if grad_c_n is None else grad_c_n.contiguous()  # held: the library reads it
    if route is sequence.FUSED:  # the reverse recurrence and every product in the library
        d_data, d_weights, d_bias = torch.empty_like(data), torch.empty_like(weights), weights.new_empty(len(weights))
        sequence._packed_fused_backward_kernel(
            data, grad_output.data_ptr(), ptr(grad_c_n), data.data_ptr(), weights.data_ptr(), h0.data_ptr(),
            c0.data_ptr(), pack.first.data_ptr(), pack.lengths.data_ptr(), output.data_ptr(), cells.data_ptr(),
            gates.data_ptr(), d_gates.data_ptr(), d_data.data_ptr(), d_weights.data_ptr(), d_bias.data_ptr(),
            d_h0.data_ptr(), d_c0.data_ptr(), pack.steps, pack.batch, pack.rows, data.shape[1], state,
            DTYPE_CODES[data.dtype])
        return d_data, d_weights, d_bias, d_h0, d_c0
    if route is sequence.ONE_CALL:
        _backward_kernel(data, grad_output.data_ptr(), ptr(grad_c_n), gates.data_ptr(), weights.data_ptr(),
                         weights.shape[1], c0.data_ptr(), cells.data_ptr(), d_gates.data_ptr(), d_h0.data_ptr(),
                         d_c0.data_ptr(), pack.sizes.data_ptr(), pack.steps, pack.batch, state,
                         DTYPE_CODES[data.dtype])
    else:
        _backward_steps(grad_output, torch.zeros_like(c0) if grad_c_n is None else grad_c_n, gates,
                        weights[:, :state], c0, cells, d_gates, d_h0, d_c0, pack)
    inputs = torch.cat([torch.cat([h0, output]).index_select(0, pack.previous), data], dim=1)
    d_data, d_weights = torch.empty_like(data), torch.empty_like(weights)
    sequence.cpu_product(d_gates, weights[:, state:], d_data)  # torch.mm, or the library's on some CPUs
    sequence.cpu_product(d_gates, inputs, d_weights, transpose_a=True)
    return d_data, d_weights, d_gates.sum(0), d_h0, d_c0


# ---- the recurrence step by step: CUDA, where the persistent kernels do not fit ------------------

def _forward_steps(gates, w_h, h0, c0, output, cells, pack: Pack) -> None:
    """Each step's product over its rows, added into its gates (the input half already there),
    then the cell's pointwise kernel, which writes its rows of output and cells: on CUDA in one
    library call over torch's cuBLAS (``_cublas``), else from Python, the steps' views made at
    once (``split``): per step one torch op and one library call."""
    state, code, w_t = h0.shape[1], DTYPE_CODES[gates.dtype], w_h.t()
    cublas = _cublas.for_tensor(gates)
    if cublas is not None:  # the same loop in the library, each product by torch's cuBLAS
        _steps_forward_kernel(gates, *cublas, gates.data_ptr(), w_h.data_ptr(), w_h.stride(0), 0, h0.data_ptr(),
                              c0.data_ptr(), output.data_ptr(), cells.data_ptr(), pack.host_array, pack.steps,
                              pack.batch, state, 1, code)
        return
    h, c = h0, c0
    for g, new_h, new_c in zip(gates.split(pack.host_sizes), output.split(pack.host_sizes),
                               cells.split(pack.host_sizes)):
        rows = len(g)
        g.addmm_(h if len(h) == rows else h[:rows], w_t)
        _cell_forward_kernel(g, g.data_ptr(), c.data_ptr(), new_h.data_ptr(), new_c.data_ptr(), rows, state, code)
        h, c = new_h, new_c


def _backward_steps(grad_output, grad_c_n, gates, w_h, c0, cells, d_gates, d_h0, d_c0, pack: Pack) -> None:
    """The reverse loop: step t's pointwise backward adds the gradient reaching its new_h from
    step t + 1 (``d_h``, rows of step t + 1; zero in the rows that end at t, never written) as it
    reads grad_output; then that step's product gives step t - 1's.  d_cell alternates between
    two buffers (a kernel's input and output must not overlap), both grad_c_n at first: a row's
    entry is the gradient of its cell from the step after, or grad_c_n at its own last step,
    where no later step has written it.  Step 0 writes d_c0.  On CUDA the library runs the
    same loop over torch's cuBLAS (``_cublas``)."""
    sizes = pack.host_sizes
    state, code, steps = d_h0.shape[1], DTYPE_CODES[gates.dtype], len(sizes)
    d_h = torch.zeros_like(d_h0)
    cublas = _cublas.for_tensor(gates)
    if cublas is not None:  # the same loop in the library, each product by torch's cuBLAS
        d_cell = torch.stack((grad_c_n, grad_c_n))  # the two buffers, back to back
        _steps_backward_kernel(gates, *cublas, grad_output.data_ptr(), gates.data_ptr(), w_h.data_ptr(),
                               w_h.stride(0), 0, c0.data_ptr(), cells.data_ptr(), d_cell.data_ptr(), d_h.data_ptr(),
                               d_gates.data_ptr(), d_h0.data_ptr(), d_c0.data_ptr(), pack.host_array, steps,
                               pack.batch, state, 1, 1, code)
        return
    g, go, dg, old = gates.split(sizes), grad_output.split(sizes), d_gates.split(sizes), (c0, *cells.split(sizes))
    d_cell = (grad_c_n.clone(), grad_c_n.clone())
    for t in range(steps - 1, -1, -1):
        rows, later = sizes[t], sizes[t + 1] if t + 1 < steps else 0
        _backward_parts_kernel(d_h0, go[t].data_ptr(), d_h.data_ptr() if later else None, 1 if later else 0,
                               d_cell[(t + 1) % 2].data_ptr(), g[t].data_ptr(), old[t].data_ptr(), dg[t].data_ptr(),
                               (d_c0 if t == 0 else d_cell[t % 2]).data_ptr(), rows, state, code)
        torch.mm(dg[t], w_h, out=d_h0 if t == 0 else d_h[:rows])


# ---- a bidirectional layer's two directions in lockstep, step by step (the step loop's route) --

def both_forward(data, pack: Pack, params, h0, c0):
    """Both directions of a bidirectional layer over a pack as one step loop: step t of the
    forward direction and step t of the reverse one (each sequence reversed within its own
    length: the same batch sizes) at once, each step one batched product over the two
    directions' weights and one pointwise launch over both directions' rows.  The buffers
    interleave the directions row by row ([N, 2, ...]: step t's rows are a contiguous [2 *
    rows_t] block, and the first rows_t pairs of the step before are its old cells), so the
    cell's kernel needs no change.  params: (weights, bias) of the forward then the reverse
    direction; h0, c0 [2, B, S].  -> (output [N, 2S] in nn.LSTM's layout, h_n, c_n [2, B, S],
    and the buffers the backward reads: outputs, cells [N, 2, S] and gates [N, 2, 3S], the
    reverse direction's rows in its own (reversed) order)."""
    (w_f, b_f), (w_r, b_r) = params
    state, code, sizes = h0.shape[-1], DTYPE_CODES[data.dtype], pack.host_sizes
    gates = data.new_empty(pack.rows, 2, 3 * state)
    for d, (w, b, x) in enumerate(((w_f, b_f, data), (w_r, b_r, data.index_select(0, pack.reverse)))):
        torch.addmm(b, x, w[:, state:].t(), out=gates[:, d])
    w_h = torch.stack((w_f[:, :state], w_r[:, :state]))  # [2, 3S, S]
    outputs, cells = data.new_empty(pack.rows, 2, state), data.new_empty(pack.rows, 2, state)
    h, c = h0.transpose(0, 1).contiguous(), c0.transpose(0, 1).contiguous()  # [B, 2, S]
    cublas = _cublas.for_tensor(data)
    if cublas is not None:  # the same loop in the library, each product by torch's cuBLAS
        _steps_forward_kernel(data, *cublas, gates.data_ptr(), w_h.data_ptr(), state, 3 * state * state, h.data_ptr(),
                              c.data_ptr(), outputs.data_ptr(), cells.data_ptr(), pack.host_array, pack.steps,
                              pack.batch, state, 2, code)
    else:
        w_t = w_h.transpose(1, 2)  # [2, S, 3S]
        for g, new_h, new_c in zip(gates.split(sizes), outputs.split(sizes), cells.split(sizes)):
            rows = len(g)
            g.transpose(0, 1).baddbmm_(h[:rows].transpose(0, 1), w_t)
            _cell_forward_kernel(g, g.data_ptr(), c.data_ptr(), new_h.data_ptr(), new_c.data_ptr(), 2 * rows, state,
                                 code)
            h, c = new_h, new_c
    output = torch.cat((outputs[:, 0], outputs[:, 1].index_select(0, pack.reverse)), dim=1)
    h_n, c_n = (t.index_select(0, pack.last).transpose(0, 1) for t in (outputs, cells))
    return output, h_n, c_n, outputs, cells, gates


SPLIT_PARTS = 8  # slices of a lockstep backward step's inner dimension, where split_parts splits it


def split_parts(data: Tensor, state: int) -> int:
    """In how many slices of its inner dimension (3S) the library's lockstep backward loop
    runs each step's product d_gates_t @ W_h (prl_lltm_packed_steps_backward_cuda's ``parts``):
    SPLIT_PARTS in full-precision float32 (CUDA cores, no TF32), else 1 (one strided batch of
    the two directions)."""
    split = data.dtype == torch.float32 and not sequence._tensor_core_products(data) and (3 * state) % SPLIT_PARTS == 0
    return SPLIT_PARTS if split else 1


def both_backward(grad_output, grad_h_n, grad_c_n, data, pack: Pack, params, h0, c0, outputs, cells, gates):
    """both_forward's gradients: grad_output [N, 2S] or None, grad_h_n and grad_c_n [2, B, S] or
    None (zero).  The reverse loop of _backward_steps over both directions' rows at once.  ->
    (d_data, [d_weights, d_bias of the forward then the reverse direction], d_h0, d_c0 [2, B, S])."""
    (w_f, _), (w_r, _) = params
    state, code, sizes = h0.shape[-1], DTYPE_CODES[data.dtype], pack.host_sizes
    go = data.new_zeros(pack.rows, 2, state)
    if grad_output is not None:
        go[:, 0] = grad_output[:, :state]
        go[:, 1] = grad_output[:, state:].index_select(0, pack.reverse)
    if grad_h_n is not None:  # h_n is each sequence's output row at its last step
        go.index_add_(0, pack.last, grad_h_n.transpose(0, 1))
    d_cell = grad_c_n.transpose(0, 1).contiguous() if grad_c_n is not None else data.new_zeros(pack.batch, 2, state)
    d_cell = torch.stack((d_cell, d_cell))  # a kernel's input and output must not overlap: two buffers, in turn
    cublas = _cublas.for_tensor(data)
    parts = 1 if cublas is None else split_parts(data, state)
    # d_h: the gradient reaching h_t from step t + 1's product, [B, 2, S]; its parts, [B, 2, parts, S]
    d_gates, d_h = torch.empty_like(gates), data.new_zeros(pack.batch, 2, *([parts] if parts > 1 else []), state)
    d_h0, d_c0 = data.new_empty(pack.batch, 2, state), data.new_empty(pack.batch, 2, state)
    w_h = torch.stack((w_f[:, :state], w_r[:, :state]))  # [2, 3S, S]
    c_0 = c0.transpose(0, 1).contiguous()
    if cublas is not None:  # the same loop in the library, each product by torch's cuBLAS
        _steps_backward_kernel(data, *cublas, go.data_ptr(), gates.data_ptr(), w_h.data_ptr(), state,
                               3 * state * state, c_0.data_ptr(), cells.data_ptr(), d_cell.data_ptr(), d_h.data_ptr(),
                               d_gates.data_ptr(), d_h0.data_ptr(), d_c0.data_ptr(), pack.host_array, pack.steps,
                               pack.batch, state, 2, parts, code)
    else:
        g, gos, dg, old = gates.split(sizes), go.split(sizes), d_gates.split(sizes), (c_0, *cells.split(sizes))
        for t in range(len(sizes) - 1, -1, -1):
            rows, later = sizes[t], sizes[t + 1] if t + 1 < len(sizes) else 0
            _backward_parts_kernel(d_h0, gos[t].data_ptr(), d_h.data_ptr() if later else None, 1 if later else 0,
                                   d_cell[(t + 1) % 2].data_ptr(), g[t].data_ptr(), old[t].data_ptr(),
                                   dg[t].data_ptr(), (d_c0 if t == 0 else d_cell[t % 2]).data_ptr(), 2 * rows, state,
                                   code)
            torch.bmm(dg[t].transpose(0, 1), w_h, out=(d_h0 if t == 0 else d_h[:rows]).transpose(0, 1))
    reverse_data = data.index_select(0, pack.reverse)
    d_data, grads = None, []
    for d, (w, x, h_0) in enumerate(((w_f, data, h0[0]), (w_r, reverse_data, h0[1]))):
        d_g = d_gates[:, d]
        d_x = d_g @ w[:, state:]
        d_data = d_x if d_data is None else d_data + d_x.index_select(0, pack.reverse)
        inputs = torch.cat([torch.cat([h_0, outputs[:, d]]).index_select(0, pack.previous), x], dim=1)
        grads += [d_g.t() @ inputs, d_g.sum(0)]
    return d_data, grads, d_h0.transpose(0, 1), d_c0.transpose(0, 1)


def _differentiable(data, weights, bias, h0, c0, pack: Pack):
    """PackedLLTMFunction's results in torch ops, step by step over the pack's rows."""
    outputs, h, c, row = [], h0, c0, 0
    for rows in pack.host_sizes:
        g = F.linear(torch.cat([h[:rows], data[row:row + rows]], dim=1), weights, bias)
        new_h, new_c = _pointwise_differentiable(g, c[:rows])
        outputs.append(new_h)
        h, c, row = torch.cat([new_h, h[rows:]]), torch.cat([new_c, c[rows:]]), row + rows
    return torch.cat(outputs), h, c


def _differentiable_backward(ctx, inputs, grads):
    """The backward as differentiable torch ops (a graph of the gradient is being built): the
    vjp of ``_differentiable`` through torch.func, which composes with torch.func's transforms
    around it as well as with autograd (``torch.autograd.grad`` of a recomputation would see
    none of a transform's tensors)."""
    results, pullback = torch.func.vjp(lambda *ins: _differentiable(*ins, ctx.pack), *inputs)
    grads = pullback(tuple(torch.zeros_like(r) if g is None else g for r, g in zip(results, grads)))
    return (*(g if need else None for g, need in zip(grads, ctx.needs_input_grad)), None)
