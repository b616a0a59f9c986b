"""lltm_sequence: the LLTM cell run over a whole sequence, one autograd node per sequence.

``gates_t = [h_{t-1}, x_t] @ W^T + b`` splits into an input half, ``x_t @ W_x^T + b``,
computed for every step at once (one GEMM of [T*B, I] x [I, 3S]), and a recurrent half,
``h_{t-1} @ W_h^T``, added in place per step (one ``addmm_``).  Each step's pointwise kernel
then writes its new_h and new_cell straight into their slices of the outputs (a pointer
offset, no stack or cat).  The backward walks the steps in reverse with one pointwise
kernel and one product per step, and forms the input, weight and bias gradients as
single products / a reduction over all steps at the end.

Layers, as for the cell:
- ``pyroundlib::lltm_sequence_forward`` / ``lltm_sequence_backward``: the sequence as torch
  ops (fake implementations for torch.compile and export), each taking one of four routes
  (``_route``, below): the whole sequence in the library (fused kernels), the recurrence in
  one library call (persistent CUDA kernels, the CPU loop), or the loops above from Python,
  replayed from CUDA graphs (``graphs.py``) where that pays.
- ``LLTMSequenceFunction``: the autograd Function (``setup_context``, ``vmap``, ``jvp``);
  when a graph of the gradient is being built, its backward runs as differentiable torch
  ops instead (double backward, torch.func).  ``_LLTMSequenceNoJvp``: the same without
  ``jvp``, which torch.compile traces (Dynamo refuses a Function with ``jvp``).
- ``lltm_sequence`` checks and applies; ``LLTMLayer`` (layer.py) is the module.
"""
import contextlib
import ctypes
import math
import os
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _ffi, _threads, graphs
from ._common import (DIRECT_WITHOUT_GRAD, DTYPE_CODES, LIBRARY, Kernel, autocast_cast, check_like, check_shape,
                      check_tensor, define_op, function_for, has_tangent, no_gradient_wanted, ptr, signature_once)
from .lltm import (_backward_differentiable, _forward_kernel, _pointwise_differentiable,
                   _pointwise_jvp)


# ---- the route ------------------------------------------------------------------------------
# A sequence call takes one of four routes, picked by ``_route`` from the call's facts in this
# order.  What each route is worth (the benchmark's rows with and without it, H100) is in
# benchmarks/NOTES.md, measured by benchmarks/mechanisms.py.
#
# FUSED     CUDA, every dtype: the whole sequence, its input half and its gradient products in
#           one library call per direction, the weights staged in shared memory (where they fit,
#           and T*B*S < FUSED_MAX_WORK): short sequences of small states, where a torch GEMM's
#           host time would outweigh its work.  A step is serial in S + I, so past
#           FUSED_MAX_STEPS steps the persistent kernels, where they run, are faster (H100,
#           fwd+bwd wall time: at 100-128 steps the fused pair takes 0.56-0.80x the persistent
#           route's time at S = 32-64; at 512 steps mostly more, up to 2.2x).  A call that wants
#           no gradient (inference) takes the persistent kernels from PERSISTENT_INFERENCE_FROM_STEPS
#           steps (float32 at T = 32: 0.45-0.88x the fused forward's time with a wide input or
#           state, 0.93-1.09x otherwise); below, the fused forward is within 10% or faster, up to
#           1.6x in bfloat16 (benchmarks/NOTES.md).
# ONE_CALL  The recurrence in one library call per direction.  CUDA, where the recurrent weights
#           fit in the registers of one co-resident grid (the persistent kernels; in 16 bits on
#           sm_80+ their products run on tensor cores where that is faster: the library's plan),
#           every dtype, from PERSISTENT_MIN_STEPS steps or PERSISTENT_MIN_WORK on, and at any
#           length where the step loop would not be replayed (below); where they fit only in
#           row tiles of two pairs a thread, only where the loop would not be replayed (_route's
#           comment).  CPU, every dtype and
#           size: the library splits each call among torch's threads as the machine and the
#           sizes allow (by batch rows, or step by step by columns: Plan in
#           native/src/lltm_sequence_cpu.cpp), and its products are as fast as torch's GEMMs
#           at these sizes while it pays no per-step Python, dispatch or ctypes call (the step
#           loop took 1.0-5.2x its time on a 2-core and a 16-core machine: benchmarks/NOTES.md).
# REPLAYED  The step loop from Python (a torch GEMM and a pointwise kernel per step), captured
#           into CUDA graphs and replayed (graphs.py), where the products run on tensor cores
#           (float16, bfloat16; float32 with TF32 allowed): a step's GPU work is then short next
#           to its launches, and the replay is the call's speed.
# STEPS     The step loop as it is: on the CPU only when asked for (=0) or where the library
#           loop cannot take the sizes (B*3S or T of 2^31 or more); on CUDA where the products run in full precision (float32 without TF32, float64), whose
#           GPU time hides the launches at the sizes the kernels above leave to this route (the
#           graphs bought 3% there and held ~1 GB at (100, 256, 512, 1024)); and with
#           PYROUNDLIB_CUDA_GRAPHS=0.
#
# PYROUNDLIB_PERSISTENT_SEQUENCE=1 takes ONE_CALL wherever it fits (short sequences too),
# =fused FUSED wherever it fits, =0 neither.  PYROUNDLIB_TENSOR_CORES, read by the library
# when it plans a grid (=1: 16-bit products on tensor cores wherever they fit, =0: never,
# unset: the plan's rule), is asked for the kernels' fit once per size: set it before the
# first call.  PYROUNDLIB_STATE_KERNELS=0, read there too, keeps S = 64 (and 16-bit S = 128) on
# the general persistent kernel instead of the one compiled for that size (the same bits).
PERSISTENT_ENV_VAR = "PYROUNDLIB_PERSISTENT_SEQUENCE"
TENSOR_CORES_ENV_VAR = "PYROUNDLIB_TENSOR_CORES"
STATE_KERNELS_ENV_VAR = "PYROUNDLIB_STATE_KERNELS"
FUSED, ONE_CALL, REPLAYED, STEPS = "fused", "one call", "replayed steps", "steps"
FUSED_MAX_WORK = 1 << 20  # T * B * S below which the fused CUDA kernels run
FUSED_MAX_STEPS = 128  # T up to which they run where the persistent kernels could
PERSISTENT_INFERENCE_FROM_STEPS = 32  # T from which inference takes the persistent kernels there
PERSISTENT_MIN_WORK = 1 << 20  # T * B * S from which the persistent kernels beat the replayed loop
PERSISTENT_MIN_STEPS = 16  # T from which they beat it at any T * B * S
# A replay over copies (graphs.py) launches 10 (forward) and 15 (backward) copies and
# replays; the loops launch about 2T + 2 and 2T + 8 kernels: from this many steps on, the
# replay costs less host time than the loop run as it is.
COPIES_PAY_FROM_STEPS = 4
_TENSOR_CORE_DTYPES = (torch.float16, torch.bfloat16)
# The persistent route on CUDA forms the input half of every step in the library call (a tiled
# product on CUDA cores: no torch GEMM's host time), except in 16 bits from T*B*I*S =
# INPUT_HALF_BY_TORCH_FROM on: there one torch GEMM on cuBLAS's tensor cores first takes
# 0.49-0.86x the time of the whole forward at (T, B, I, S) = (50, 64, 512, 512), (500, 32, 512,
# 512), (1000, 64, 256, 256), (300, 64, 128, 128) (inference; H100, 2026-11-26, in one run),
# and below it the GEMM's host time shows ((50, 1, 64, 64): 1.35x).  Float32 from
# INPUT_HALF_BY_TORCH_FROM_FLOAT32 on: cuBLAS's float32 GEMM (TF32 as torch's settings say)
# took a third of the library product's time at (50, 64, 256, 512), so a 2-layer bidirectional
# LLTMLayer's inference there 0.80x its time, lltm_sequence's at (1000, 64, 256, 256) 0.86x
# (H200, 2026-11-28, in one run); below 2^28 no row gained beyond the noise, (1000, 16, 64, 64)
# inference lost 3% (benchmarks/NOTES.md).  Float64 keeps the library's product (no gain).
INPUT_HALF_BY_TORCH_FROM = 1 << 20
INPUT_HALF_BY_TORCH_FROM_FLOAT32 = 1 << 28
# On the CPU an input half of fewer multiply-adds than this is the library's product on the
# calling thread, not a torch GEMM (input_half): twice the work the library gives one thread
# of a split (kMinPartWork, native/src/lltm_sequence_cpu.cpp), so a BLAS would not split it
# either, or should not.
INPUT_HALF_IN_LIBRARY_BELOW = 1 << 19
# Larger ones too where torch's GEMMs do not come first (_threads.torch_gemms_first: x86 CPUs
# other than Intel's with AVX-512) and W_x has at least this many columns: on an AMD EPYC with
# AVX-512 (2 threads, torch 2.13.0) the library's product took 0.48-0.72x the time of torch's
# GEMM from 32 features, 0.78-0.94 at 24 and 0.93-1.30 at 16, where a panel of 32 columns is
# half padding (benchmarks/NOTES.md).
INPUT_HALF_IN_LIBRARY_FROM_FEATURES = 32


def _tensor_core_products(t: Tensor) -> bool:
    """Whether torch's CUDA GEMMs of t's dtype run on tensor cores (float16, bfloat16; float32
    with TF32 allowed): there a step loop's products are short next to its host time."""
    return t.dtype in _TENSOR_CORE_DTYPES or (t.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32)


def _route(t: Tensor, steps: int, batch: int, features: int, state: int, inference: bool = False) -> str:
    """FUSED, ONE_CALL, REPLAYED or STEPS for a sequence of T >= 1 steps (above); ``inference``:
    for a forward that no backward follows."""
    choice = os.environ.get(PERSISTENT_ENV_VAR, "")
    if t.is_cpu:
        accepted = batch * 3 * state < 2**31 and steps < 2**31  # what the library's sequence loop takes
        return ONE_CALL if choice != "0" and accepted else STEPS
    tensor_cores = _tensor_core_products(t)
    fits = _fits(_persistent_fits, "prl_lltm_sequence_cuda_fits", t, batch, state) if choice != "0" else 0
    # fits == 2: the persistent kernels fit only in row tiles of two (row, column) pairs a thread
    # (16-bit batches too wide for one pair a thread: 16-column tiles in one grid, its barrier
    # every step), whose step costs more than the replayed loop's: on an H100 (2026-11-27) a
    # 2-layer bidirectional bfloat16 LLTMLayer took 1.65-1.81x the replay's time at (T, B, I, S) =
    # (200, 64, 128, 768), 1.34-1.61x at (100, 64, 256, 1024), lltm_sequence 1.10-1.20x.  So a
    # padded batch takes them only where the loop is not replayed, or when asked for (=1); a
    # pack, never replayed, takes them (_packed_in_one_call: 0.55-0.85x the library's step loop
    # over cuBLAS there; benchmarks/NOTES.md).
    persistent = fits == 1 or (fits == 2 and (choice == "1" or not graphs.enabled()))
    fused = choice in ("", "fused") and (choice == "fused" or steps * batch * state < FUSED_MAX_WORK) \
        and _fits(_fused_fits, "prl_lltm_sequence_fused_cuda_fits", t, batch, features, state)
    if fused and (choice == "fused" or steps <= FUSED_MAX_STEPS or not persistent):
        if inference and persistent and not choice and steps >= PERSISTENT_INFERENCE_FROM_STEPS:
            return ONE_CALL
        return FUSED
    if persistent and (choice == "1" or not tensor_cores or steps >= PERSISTENT_MIN_STEPS
                       or steps * batch * state >= PERSISTENT_MIN_WORK):
        return ONE_CALL
    return REPLAYED if tensor_cores and graphs.enabled() else STEPS


def _packed_in_one_call(t: Tensor, batch: int, state: int) -> bool:
    """Whether a packed batch (``LLTMLayer``) runs each direction's recurrence in one library
    call that takes the pack's batch sizes (``_packed.py``): on the CPU always, on CUDA
    wherever the persistent kernels fit (in row tiles of two pairs a thread too), in every dtype.  Otherwise (and with =0) the step
    loop over each step's rows (on CUDA run by the library over torch's cuBLAS, as
    ``_packed._forward_steps`` says).  A pack's steps differ in size, so the step
    loop is not replayed from CUDA graphs (a capture per pack would rarely be replayed), and
    the persistent kernels beat it in every dtype: 0.24x its time forward+backward in bfloat16,
    0.32x in float32, at (50, 64, 256, 512) on an H100 (benchmarks/NOTES.md)."""
    if os.environ.get(PERSISTENT_ENV_VAR, "") == "0":
        return False
    return t.is_cpu or _fits(_persistent_fits, "prl_lltm_sequence_cuda_fits", t, batch, state) > 0


def _packed_route(t: Tensor, steps: int, batch: int, features: int, state: int) -> str:
    """FUSED, ONE_CALL or STEPS for a direction over a pack (``_packed.py``) of ``steps`` steps
    and ``batch`` sequences: on CUDA the fused kernels, reading the pack's rows, where a padded
    batch of its steps would take them (``_route``); else ``_packed_in_one_call``'s choice."""
    if not t.is_cpu and steps and _route(t, steps, batch, features, state) is FUSED:
        return FUSED
    return ONE_CALL if _packed_in_one_call(t, batch, state) else STEPS


_persistent_fits = {}  # (device index, dtype, batch, state) -> whether the persistent kernels fit (0, 1, 2)
_fused_fits = {}  # (device index, dtype, batch, features, state) -> whether the fused kernels fit


def _fits(cache: dict, query: str, t: Tensor, *sizes: int) -> int:
    """The library's answer to ``query(*sizes, dtype, device, &fits)`` for t's dtype and
    device (0: does not fit; prl_lltm_sequence_cuda_fits's 2: only in row tiles of two pairs a
    thread), asked once per (device, dtype, sizes) and kept in ``cache``."""
    key = (t.get_device(), t.dtype, *sizes)
    fits = cache.get(key)
    if fits is None:
        answer = ctypes.c_int(0)
        getattr(_ffi.library(), query)(*sizes, DTYPE_CODES[t.dtype], key[0], ctypes.byref(answer))
        fits = cache[key] = answer.value
    return fits


_sequence_forward_kernel = Kernel("lltm_sequence_forward")
_sequence_backward_kernel = Kernel("lltm_sequence_backward")
_persistent_forward_kernel = Kernel("lltm_sequence_persistent_forward", cpu=False)
_backward_parts_kernel = Kernel("lltm_backward_parts")
_input_half_kernel = Kernel("lltm_input_half", cuda=False)
_fused_forward_kernel = Kernel("lltm_sequence_fused_forward", cpu=False)
_fused_backward_kernel = Kernel("lltm_sequence_fused_backward", cpu=False)
_packed_fused_forward_kernel = Kernel("lltm_packed_fused_forward", cpu=False)
_packed_fused_backward_kernel = Kernel("lltm_packed_fused_backward", cpu=False)


# ---- argument checks -------------------------------------------------------------------------

def _check_sequence_args(input, weights, bias, h0, c0) -> None:
    """Raise TypeError/ValueError naming the first bad argument."""
    check_tensor("input", input)
    for name, value in (("weights", weights), ("bias", bias), ("h0", h0), ("c0", c0)):
        check_like(name, value, "input", input)
    if input.dim() != 3:
        raise ValueError(f"input must be 3-D [time, batch, input_features], got shape {list(input.shape)}")
    if weights.dim() != 2 or weights.shape[0] % 3:
        raise ValueError(f"weights must be 2-D [3*state_size, state_size+input_features], got shape "
                         f"{list(weights.shape)}")
    steps, batch, features = input.shape
    state = weights.shape[0] // 3
    sizes = f"(time={steps}, batch={batch}, input_features={features} from input; state_size={state} from weights)"
    check_shape("weights", weights, (3 * state, state + features), f"[3*state_size, state_size+input_features] {sizes}")
    check_shape("bias", bias, (3 * state,), f"[3*state_size] {sizes}")
    check_shape("h0", h0, (batch, state), f"[batch, state_size] {sizes}")
    check_shape("c0", c0, (batch, state), f"[batch, state_size] {sizes}")


# ---- the loops (native kernels + torch GEMMs) ---------------------------------------------------

def _pointers(t: Tensor) -> List[int]:
    """The address of each t[k] of a contiguous tensor: the kernels' slices, as pointer offsets."""
    base, step = t.data_ptr(), t[0].numel() * t.element_size() if t.shape[0] else 0
    return [base + k * step for k in range(t.shape[0])]


def _cpu_product_in_library(columns: int) -> bool:
    """Whether a CPU sequence's product with this many columns is the library's rather than
    torch's GEMM, an input half too large for INPUT_HALF_IN_LIBRARY_BELOW (W_x^T's columns: the
    features) or a gradient product of all steps (_gradients_of_all_steps: the input gradient's
    I, the weight gradient's S + I): where torch's GEMMs do not come first
    (_threads.torch_gemms_first: x86 CPUs other than Intel's with AVX-512) and the columns fill a
    register tile's 32 (INPUT_HALF_IN_LIBRARY_FROM_FEATURES).  On an AMD EPYC with AVX-512 (2
    threads, torch 2.13.0) the library's gradient products took 0.48-0.64x torch's time at
    2^23-2^31 multiply-adds, 0.79-0.89x at 2^18-2^21; with 16 columns 0.98 (benchmarks/NOTES.md)."""
    return columns >= INPUT_HALF_IN_LIBRARY_FROM_FEATURES and not _threads.torch_gemms_first()


def _input_half(input: Tensor, weights: Tensor, bias: Tensor, gates: Tensor) -> None:
    """gates[t] = x_t @ W_x^T + b for every step, one GEMM of [T*B, I] x [I, 3S]."""
    steps, batch, features = input.shape
    torch.addmm(bias, input.view(steps * batch, features), weights[:, weights.shape[1] - features:].t(),
                out=gates.view(steps * batch, gates.shape[2]))


def input_half(input: Tensor, weights: Tensor, bias: Tensor, state: int) -> Tensor:
    """x @ W_x^T + b over input's last dimension, W_x = weights[:, state:], for the library's
    sequence loops: one torch GEMM, but on the CPU the library's product
    (prl_lltm_input_half_cpu) below INPUT_HALF_IN_LIBRARY_BELOW multiply-adds, and above it
    where _cpu_product_in_library says so for its features.  Small ones:
    there a BLAS's threads cannot pay, and MKL ran some such shapes on a smaller team than
    torch's: libgomp ends the surplus threads, the loop's next parallel region starts them
    again (10-12 thread starts a call on a 16-core Xeon: benchmarks/NOTES.md)."""
    rows, features = math.prod(input.shape[:-1]), input.shape[-1]
    if not input.is_cpu or (rows * features * 3 * state >= INPUT_HALF_IN_LIBRARY_BELOW
                            and not _cpu_product_in_library(features)):
        return F.linear(input, weights[:, state:], bias)
    input, weights, bias = input.contiguous(), weights.contiguous(), bias.contiguous()
    gates = input.new_empty(*input.shape[:-1], 3 * state)
    _input_half_kernel(input, input.data_ptr(), weights.data_ptr(), bias.data_ptr(), gates.data_ptr(), rows,
                       input.shape[-1], state, DTYPE_CODES[input.dtype])
    return gates


def _forward_loop(input: Tensor, weights: Tensor, bias: Tensor, h0: Tensor, c0: Tensor, output: Tensor,
                  c_n: Tensor, cells: Tensor, gates: Tensor) -> None:
    """Fills gates [T, B, 3S], output (new_h of each step), cells (new_cell) [T, B, S] and
    c_n [B, S] (T >= 1)."""
    steps, batch, features = input.shape
    state = h0.shape[1]
    code = DTYPE_CODES[input.dtype]
    w_h = weights[:, :state]
    _input_half(input, weights, bias, gates)
    g, g_ptr, h_ptr, c_ptr = gates.unbind(0), _pointers(gates), _pointers(output), _pointers(cells)
    h, old_cell = h0, c0.data_ptr()
    for t in range(steps):
        g[t].addmm_(h, w_h.t())
        _forward_kernel(input, g_ptr[t], old_cell, h_ptr[t], c_ptr[t], batch, state, code)
        h, old_cell = output[t], c_ptr[t]
    c_n.copy_(cells[steps - 1])


def _forward_one_call(input: Tensor, weights: Tensor, bias: Tensor, h0: Tensor, c0: Tensor):
    """_forward_op's results from one library call for the recurrence; on CUDA its input half
    too (the persistent route), on the CPU, and on CUDA from INPUT_HALF_BY_TORCH_FROM (16 bits)
    or INPUT_HALF_BY_TORCH_FROM_FLOAT32 on, after one torch GEMM for it."""
    work = input.numel() * h0.shape[1]
    by_torch = work >= INPUT_HALF_BY_TORCH_FROM if input.dtype in _TENSOR_CORE_DTYPES else \
        input.dtype == torch.float32 and work >= INPUT_HALF_BY_TORCH_FROM_FLOAT32
    if input.is_cuda and not by_torch:
        return _forward_whole(_persistent_forward_kernel, input, weights, bias, h0, c0)
    steps, batch, features = input.shape
    state = h0.shape[1]
    gates = input_half(input, weights, bias, state)
    output, cells, c_n = input.new_empty(steps, batch, state), input.new_empty(steps, batch, state), torch.empty_like(c0)
    _sequence_forward_kernel(input, gates.data_ptr(), weights.data_ptr(), state + features, h0.data_ptr(),
                             c0.data_ptr(), output.data_ptr(), cells.data_ptr(), c_n.data_ptr(), steps, batch, state,
                             DTYPE_CODES[input.dtype])
    return output, c_n, cells, gates


def _backward_one_call(grad_output: Tensor, grad_c_n: Optional[Tensor], input: Tensor, weights: Tensor, h0: Tensor,
                       c0: Tensor, output: Tensor, cells: Tensor, gates: Tensor):
    """_backward_op's results from one library call (the reverse recurrence, d_h0 and d_c0),
    made first, and the products over all steps."""
    steps, batch, features = input.shape
    state = h0.shape[1]
    d_gates, d_h0, d_c0 = torch.empty_like(gates), torch.empty_like(h0), torch.empty_like(c0)
    _sequence_backward_kernel(input, grad_output.data_ptr(), ptr(grad_c_n), gates.data_ptr(),
                              weights.data_ptr(), state + features, c0.data_ptr(), cells.data_ptr(),
                              d_gates.data_ptr(), d_h0.data_ptr(), d_c0.data_ptr(), steps, batch, state,
                              DTYPE_CODES[input.dtype])
    d_input, d_weights, d_bias = torch.empty_like(input), torch.empty_like(weights), weights.new_empty(weights.shape[0])
    _gradients_of_all_steps(d_gates, input, weights, h0, output, d_input, d_weights, d_bias)
    return d_input, d_weights, d_bias, d_h0, d_c0


def _forward_whole(kernel: Kernel, input: Tensor, weights: Tensor, bias: Tensor, h0: Tensor, c0: Tensor):
    """_forward_op's results from one library call that runs the whole forward, input half
    included: the fused kernels' or the persistent route's on CUDA (same arguments)."""
    steps, batch, features = input.shape
    state = h0.shape[1]
    output, cells = input.new_empty(steps, batch, state), input.new_empty(steps, batch, state)
    gates, c_n = input.new_empty(steps, batch, 3 * state), torch.empty_like(c0)
    kernel(input, input.data_ptr(), weights.data_ptr(), bias.data_ptr(), h0.data_ptr(), c0.data_ptr(),
           output.data_ptr(), cells.data_ptr(), gates.data_ptr(), c_n.data_ptr(), steps, batch, features, state,
           DTYPE_CODES[input.dtype])
    return output, c_n, cells, gates


def _backward_fused(grad_output: Tensor, grad_c_n: Optional[Tensor], input: Tensor, weights: Tensor, h0: Tensor,
                    c0: Tensor, output: Tensor, cells: Tensor, gates: Tensor):
    """_backward_op's results from one library call: the fused kernels' backward."""
    steps, batch, features = input.shape
    state = h0.shape[1]
    d_gates, d_input, d_weights = torch.empty_like(gates), torch.empty_like(input), torch.empty_like(weights)
    d_bias, d_h0, d_c0 = weights.new_empty(weights.shape[0]), torch.empty_like(h0), torch.empty_like(c0)
    _fused_backward_kernel(input, grad_output.data_ptr(), ptr(grad_c_n), input.data_ptr(), weights.data_ptr(),
                           h0.data_ptr(), c0.data_ptr(), output.data_ptr(), cells.data_ptr(), gates.data_ptr(),
                           d_gates.data_ptr(), d_input.data_ptr(), d_weights.data_ptr(), d_bias.data_ptr(),
                           d_h0.data_ptr(), d_c0.data_ptr(), steps, batch, features, state, DTYPE_CODES[input.dtype])
    return d_input, d_weights, d_bias, d_h0, d_c0


def _gradients_of_all_steps(d_gates: Tensor, input: Tensor, weights: Tensor, h0: Tensor, output: Tensor,
                            d_input: Tensor, d_weights: Tensor, d_bias: Tensor) -> None:
    """The input, weight and bias gradients of all steps at once, from d_gates [T, B, 3S]."""
    steps, batch, features = input.shape
    state = h0.shape[1]
    rows = d_gates.view(steps * batch, 3 * state)
    cpu_product(rows, weights[:, state:], d_input.view(steps * batch, features))
    # the weight gradient: d_gates^T @ [h_{t-1}, x_t] over all steps
    if d_gates.is_cuda:
        # three products straight into d_weights' column blocks (cuBLAS writes a block with
        # the row stride S+I): at (100, 256, 512, 1024) on an H100 the three gradients took 543
        # against 602 us in bfloat16, 6.57 against 6.83 ms in float32 through a [T*B, S+I]
        # concatenation
        torch.mm(rows[batch:].t(), output[:-1].view((steps - 1) * batch, state), out=d_weights[:, :state])
        d_weights[:, :state].addmm_(d_gates[0].t(), h0)
        torch.mm(rows.t(), input.view(steps * batch, features), out=d_weights[:, state:])
    else:
        # one product over a [T*B, S+I] copy of what the steps read: on the CPU faster than
        # column-block products (78 against 125 us at T = 8, B = 32)
        x = torch.cat([torch.cat([h0.unsqueeze(0), output[:-1]]), input], dim=2)
        cpu_product(rows, x.view(steps * batch, state + features), d_weights, transpose_a=True)
    torch.sum(rows, dim=0, out=d_bias)


_matmul_kernel = Kernel("matmul", cuda=False)


def _rows_contiguous(t: Tensor) -> bool:
    """Whether matrix t's rows are contiguous, each at least a row's length after the last."""
    return t.stride(1) == 1 and t.stride(0) >= max(1, t.shape[1])


def cpu_product(a: Tensor, b: Tensor, out: Tensor, transpose_a: bool = False) -> None:
    """out = a @ b (a^T @ b with transpose_a), matrices of one dtype: a CPU sequence's gradient
    products of all steps.  The library's product (prl_matmul_cpu) where
    _cpu_product_in_library says so for out's columns and each matrix's rows are contiguous,
    else torch.mm."""
    if a.is_cpu and _cpu_product_in_library(out.shape[1]) and all(map(_rows_contiguous, (a, b, out))):
        m, n = out.shape
        k = a.shape[0] if transpose_a else a.shape[1]
        _matmul_kernel(out, a.data_ptr(), a.stride(0), int(transpose_a), b.data_ptr(), b.stride(0), out.data_ptr(),
                       out.stride(0), m, n, k, DTYPE_CODES[out.dtype])
    else:
        torch.mm(a.t() if transpose_a else a, b, out=out)


def _backward_loop(grad_output: Tensor, grad_c_n: Tensor, input: Tensor, weights: Tensor, h0: Tensor,
                   c0: Tensor, output: Tensor, cells: Tensor, gates: Tensor, d_input: Tensor, d_weights: Tensor,
                   d_bias: Tensor, d_h0: Tensor, d_c0: Tensor) -> None:
    """Fills the five gradients (T >= 1): the reverse loop, one pointwise kernel and one
    product per step, then the input, weight and bias gradients of all steps at once."""
    steps, batch, features = input.shape
    state = h0.shape[1]
    code = DTYPE_CODES[input.dtype]
    w_h = weights[:, :state]
    d_gates = torch.empty_like(gates)
    # The gradient reaching step t's new_h is grad_output[t] plus step t + 1's d_gates @ W_h,
    # which that step leaves in `d_h`: the pointwise kernel adds the two as it reads them
    # (prl_lltm_backward_parts with one part), so no copy of grad_output and no accumulation
    # pass runs.
    d_h = input.new_empty(batch, state)
    dg = d_gates.unbind(0)
    g_ptr, dg_ptr, c_ptr = _pointers(gates), _pointers(d_gates), [c0.data_ptr()] + _pointers(cells)[:-1]
    go_ptr, d_h_ptr = _pointers(grad_output), d_h.data_ptr()
    # d_cell alternates between two buffers (a kernel's input and output must not overlap);
    # the first step reads grad_c_n, the last writes d_c0
    d_cell, d_cell_in = (torch.empty_like(d_c0), torch.empty_like(d_c0)), grad_c_n.data_ptr()
    for t in range(steps - 1, -1, -1):
        d_cell_out = d_c0.data_ptr() if t == 0 else d_cell[t % 2].data_ptr()
        last = t == steps - 1
        _backward_parts_kernel(input, go_ptr[t], None if last else d_h_ptr, 0 if last else 1, d_cell_in,
                               g_ptr[t], c_ptr[t], dg_ptr[t], d_cell_out, batch, state, code)
        torch.mm(dg[t], w_h, out=d_h0 if t == 0 else d_h)
        d_cell_in = d_cell_out
    _gradients_of_all_steps(d_gates, input, weights, h0, output, d_input, d_weights, d_bias)


# ---- the ops -------------------------------------------------------------------------------------

def _forward_op(input: Tensor, weights: Tensor, bias: Tensor, h0: Tensor, c0: Tensor, inference: bool = False):
    """-> (output [T, B, S], c_n [B, S], cells [T, B, S], gates [T, B, 3S]); ``inference``: no
    backward follows (the routes of ``_route``)."""
    _check_sequence_args(input, weights, bias, h0, c0)  # raises for bad input, naming it
    input, weights, bias, h0, c0 = (t.contiguous() for t in (input, weights, bias, h0, c0))
    steps, batch, features = input.shape
    state = h0.shape[1]
    route = _route(input, steps, batch, features, state, inference) if steps else STEPS
    if route is FUSED:
        return _forward_whole(_fused_forward_kernel, input, weights, bias, h0, c0)
    if route is ONE_CALL:
        return _forward_one_call(input, weights, bias, h0, c0)
    with _buffers(input, route):
        output, cells = input.new_empty(steps, batch, state), input.new_empty(steps, batch, state)
        gates, c_n = input.new_empty(steps, batch, 3 * state), torch.empty_like(c0)
    if steps:
        _run_loop(route, _forward_loop, (input, weights, bias, h0, c0, output, c_n, cells, gates), inputs=5)
    else:
        c_n.copy_(c0)
    return output, c_n, cells, gates


def _buffers(t: Tensor, route: str):
    """Where a step loop's tensors are allocated: replayed, in blocks that repeat (graphs.buffers)."""
    return graphs.buffers(t) if route is REPLAYED else contextlib.nullcontext()


def _run_loop(route: str, loop, tensors, inputs: int) -> None:
    if route is REPLAYED:
        graphs.run(loop, tensors, inputs, copies_pay=tensors[0].shape[0] >= COPIES_PAY_FROM_STEPS)
    else:
        loop(*tensors)


def _forward_fake(input, weights, bias, h0, c0):
    _check_sequence_args(input, weights, bias, h0, c0)  # at trace time: torch.compile, export, meta tensors
    steps, batch, _ = input.shape
    state = h0.shape[1]
    return (input.new_empty(steps, batch, state), input.new_empty(batch, state),
            input.new_empty(steps, batch, state), input.new_empty(steps, batch, 3 * state))


def _backward_op(grad_output: Tensor, grad_c_n: Optional[Tensor], input: Tensor, weights: Tensor, h0: Tensor,
                 c0: Tensor, output: Tensor, cells: Tensor, gates: Tensor):
    """-> (d_input, d_weights, d_bias, d_h0, d_c0); grad_c_n None: zero."""
    if input.shape[0] == 0:
        return (torch.zeros_like(input), torch.zeros_like(weights), weights.new_zeros(weights.shape[0]),
                torch.zeros_like(h0), torch.zeros_like(c0) if grad_c_n is None else grad_c_n.clone())
    tensors = [t if t is None else t.contiguous()
               for t in (grad_output, grad_c_n, input, weights, h0, c0, output, cells, gates)]
    route = _route(input, *input.shape, h0.shape[1])
    if route is FUSED:
        return _backward_fused(*tensors)
    if route is ONE_CALL:
        return _backward_one_call(*tensors)
    with _buffers(input, route):
        if grad_c_n is None:
            tensors[1] = torch.zeros_like(tensors[5])
        grads = (torch.empty_like(tensors[2]), torch.empty_like(tensors[3]), weights.new_empty(weights.shape[0]),
                 torch.empty_like(tensors[4]), torch.empty_like(tensors[5]))
    _run_loop(route, _backward_loop, (*tensors, *grads), inputs=len(tensors))
    return grads


def _backward_fake(grad_output, grad_c_n, input, weights, h0, c0, output, cells, gates):
    # contiguous, as the op's results are, whatever the strides of its arguments (a batch_first
    # input is a transposed view)
    contiguous = torch.contiguous_format
    return (torch.empty_like(input, memory_format=contiguous), torch.empty_like(weights, memory_format=contiguous),
            weights.new_empty(weights.shape[0]), torch.empty_like(h0, memory_format=contiguous),
            torch.empty_like(c0, memory_format=contiguous))


define_op("lltm_sequence_backward(Tensor grad_output, Tensor? grad_c_n, Tensor input, Tensor weights, Tensor h0, "
          "Tensor c0, Tensor output, Tensor cells, Tensor gates) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
          _backward_op, _backward_fake)


# ---- differentiable twins (double backward, torch.func) -------------------------------------------

def _recompute(input, weights, bias, h0, c0):
    """The forward in torch ops: each step's new_h, old cell and gates, and the last cell.
    A graph autograd can differentiate again, and forward mode to any order."""
    hs, cs, gates = [], [], []
    h, c = h0, c0
    for x in input.unbind(0):
        g = F.linear(torch.cat([h, x], dim=1), weights, bias)
        gates.append(g)
        cs.append(c)
        h, c = _pointwise_differentiable(g, c)
        hs.append(h)
    return hs, cs, gates, c


def _sequence_differentiable(input, weights, bias, h0, c0):
    """lltm_sequence's results in torch ops: what it computes under forward mode (``has_tangent``)."""
    hs, _, _, c_n = _recompute(input, weights, bias, h0, c0)
    return torch.stack(hs), (hs[-1], c_n)


def _sequence_backward_differentiable(grad_output, grad_c_n, input, weights, bias, h0, c0):
    """The backward loop in torch ops (the pointwise step: the cell's differentiable twin)."""
    state = h0.shape[1]
    hs, cs, gates, _ = _recompute(input, weights, bias, h0, c0)
    w_h, w_x = weights[:, :state], weights[:, state:]
    d_h, d_c = torch.zeros_like(h0), grad_c_n  # None: zero
    d_gates = [None] * len(gates)
    for t in range(len(gates) - 1, -1, -1):
        d_gates[t], d_c = _backward_differentiable(grad_output[t] + d_h, d_c, gates[t], cs[t])
        d_h = d_gates[t].mm(w_h)
    d_gates = torch.stack(d_gates)
    rows = d_gates.flatten(0, 1)
    h_prev = torch.stack([h0] + hs[:-1])
    x = torch.cat([h_prev, input], dim=2).flatten(0, 1)
    return (d_gates.matmul(w_x), rows.t().mm(x), rows.sum(dim=0), d_h, d_c)


def _setup(ctx, inputs, output) -> None:
    output, _, cells, gates = output
    ctx.mark_non_differentiable(cells, gates)
    ctx.save_for_backward(*inputs, output, cells, gates)
    # Outputs that got no gradient arrive as None, not as zeros autograd would allocate and
    # fill (cells and gates never get one; c_n seldom): the backward treats None as zero.
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_output, grad_c_n, _grad_cells=None, _grad_gates=None):
    input, weights, bias, h0, c0, output, cells, gates = ctx.saved_tensors
    if grad_output is None:
        if grad_c_n is None:
            return None, None, None, None, None
        grad_output = torch.zeros_like(output)
    if torch.is_grad_enabled():  # a graph of the gradient is being built
        return _sequence_backward_differentiable(grad_output, grad_c_n, input, weights, bias, h0, c0)
    return torch.ops.pyroundlib.lltm_sequence_backward.default(grad_output, grad_c_n, input, weights, h0, c0,
                                                               output, cells, gates)


# The forward op is differentiable on its own too (in all five inputs, to any order): what
# torch.compile traces (through _LLTMSequenceNoJvp) and export and jit.trace record
# (``function_for``), so an exported program can be trained.  LLTMSequenceFunction calls its
# twin without the formula (define_op).
define_op("lltm_sequence_forward(Tensor input, Tensor weights, Tensor bias, Tensor h0, Tensor c0) "
          "-> (Tensor, Tensor, Tensor, Tensor)", _forward_op, _forward_fake, backward=_backward, setup_context=_setup,
          eager_twin=True)


# ---- the autograd Function -------------------------------------------------------------------------

@signature_once
class _LLTMSequenceNoJvp(torch.autograd.Function):
    """LLTMSequenceFunction without its forward-mode derivative: what torch.compile traces."""

    @staticmethod
    def forward(input, weights, bias, h0, c0):
        return torch.ops.pyroundlib.lltm_sequence_forward(input, weights, bias, h0, c0)

    @staticmethod
    def setup_context(ctx, inputs, outputs) -> None:
        _setup(ctx, inputs, outputs)

    @staticmethod
    def backward(ctx, grad_output, grad_c_n, _grad_cells, _grad_gates):
        return _backward(ctx, grad_output, grad_c_n)

    @staticmethod
    def vmap(info, in_dims, input, weights, bias, h0, c0):
        return _vmap_sequence(_LLTMSequenceNoJvp.apply, info, in_dims, input, weights, bias, h0, c0)


@signature_once
class LLTMSequenceFunction(_LLTMSequenceNoJvp):
    """The LLTM over a sequence as one autograd node: ``apply(input, weights, bias, h0, c0)
    -> (output [T, B, S], c_n [B, S], cells [T, B, S], gates [T, B, 3S])``; the last two are
    what the backward needs (non-differentiable: torch.func requires a Function's saved
    intermediates to be outputs).  ``lltm_sequence`` checks the arguments and returns
    ``(output, (h_n, c_n))``.  T >= 1.  What eager mode applies: its forward calls the op
    without an autograd formula (the Function is the node); under torch.compile
    ``lltm_sequence`` applies _LLTMSequenceNoJvp, which records the differentiable op, and
    under export and ``jit.trace`` calls that op itself."""

    @staticmethod
    def forward(input, weights, bias, h0, c0):
        return torch.ops.pyroundlib.lltm_sequence_forward_no_autograd.default(input, weights, bias, h0, c0)

    @staticmethod
    def setup_context(ctx, inputs, outputs) -> None:
        _setup(ctx, inputs, outputs)
        ctx.save_for_forward(*inputs, *outputs)

    @staticmethod
    def jvp(ctx, t_input, t_weights, t_bias, t_h0, t_c0):
        input, weights, bias, h0, c0, output, _, cells, gates = ctx.saved_tensors
        state = h0.shape[1]
        zero = torch.zeros_like
        t_input, t_weights = zero(input) if t_input is None else t_input, zero(weights) if t_weights is None else t_weights
        t_h = zero(h0) if t_h0 is None else t_h0
        t_c = t_c0
        t_gates_x = F.linear(input, t_weights[:, state:]) + F.linear(t_input, weights[:, state:])
        if t_bias is not None:
            t_gates_x = t_gates_x + t_bias
        t_out = []
        for t in range(input.shape[0]):
            h_prev, c_prev = (h0, c0) if t == 0 else (output[t - 1], cells[t - 1])
            t_g = t_gates_x[t] + F.linear(t_h, weights[:, :state]) + F.linear(h_prev, t_weights[:, :state])
            t_h, t_c = _pointwise_jvp(gates[t], c_prev, t_g, t_c)
            t_out.append(t_h)
        return torch.stack(t_out), t_c, None, None  # cells and gates are not differentiable

    @staticmethod
    def vmap(info, in_dims, input, weights, bias, h0, c0):
        return _vmap_sequence(LLTMSequenceFunction.apply, info, in_dims, input, weights, bias, h0, c0)


def _vmap_sequence(run, info, in_dims, input, weights, bias, h0, c0):
    """vmap of ``run`` (a Function's ``apply``, or the eager twin op): with shared weights the
    vmapped dimension folds into the batch; with batched weights (an ensemble), one sequence
    per set of weights."""
    n = info.batch_size

    def first(t, dim):
        return t.movedim(dim, 0) if dim is not None else t.expand(n, *t.shape)

    input, weights, bias, h0, c0 = (first(t, d) for t, d in zip((input, weights, bias, h0, c0), in_dims))
    if in_dims[1] is None and in_dims[2] is None:
        batch = input.shape[2]
        outs = run(input.transpose(0, 1).flatten(1, 2), weights[0], bias[0], h0.flatten(0, 1), c0.flatten(0, 1))
        output, c_n, cells, gates = (o.unflatten(-2 if o.dim() == 2 else 1, (n, batch)) for o in outs)
        return (output, c_n, cells, gates), (1, 0, 1, 1)
    outs = [run(*args) for args in zip(input, weights, bias, h0, c0)]
    return tuple(torch.stack(o) for o in zip(*outs)), (0, 0, 0, 0)


def _inference_op(input: Tensor, weights: Tensor, bias: Tensor, h0: Tensor, c0: Tensor):
    return _forward_op(input, weights, bias, h0, c0, inference=True)


# Where no gradient is wanted (inference, an optimiser step, vmap alone) eager
# ``lltm_sequence`` calls this op directly, without LLTMSequenceFunction.apply
# (``no_gradient_wanted``): the forward op's results and checks, no autograd formula, and the
# routes of a forward no backward follows.  It then needs a batching rule of its own.
define_op("lltm_sequence_inference(Tensor input, Tensor weights, Tensor bias, Tensor h0, Tensor c0) "
          "-> (Tensor, Tensor, Tensor, Tensor)", _inference_op, _forward_fake)
if DIRECT_WITHOUT_GRAD:
    torch.library.register_vmap(
        "pyroundlib::lltm_sequence_inference",
        lambda info, in_dims, *args: _vmap_sequence(torch.ops.pyroundlib.lltm_sequence_inference.default, info,
                                                    in_dims, *args), lib=LIBRARY)


# ---- entry points ------------------------------------------------------------------------------------

def lltm_sequence(input: Tensor, weights: Tensor, bias: Tensor,
                  state: Optional[Tuple[Tensor, Tensor]] = None) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
    """The LLTM cell over a sequence: ``(output, (h_n, c_n))``.

    input [T, B, I]; weights [3S, S+I] and bias [3S] as for ``lltm_cell``; state (h0, c0),
    each [B, S], zeros when None.  output [T, B, S] holds new_h of every step; (h_n, c_n) is
    the last step's state (T = 0: an empty output and the state unchanged).  Same dtypes,
    devices and workflows as ``lltm_cell``; differentiable in input, weights, bias, h0, c0.
    """
    if state is None:
        if not isinstance(input, torch.Tensor) or input.dim() != 3 or not isinstance(weights, torch.Tensor):
            _check_sequence_args(input, weights, bias, input, input)  # raises, naming the argument
        shape = (input.shape[1], weights.shape[0] // 3)
        state = (input.new_zeros(shape), input.new_zeros(shape))  # two tensors: torch.compile traces no aliases
    if not (isinstance(state, (tuple, list)) and len(state) == 2):
        raise TypeError(f"state must be a tuple (h0, c0) or None, got {type(state).__name__}")
    input, weights, bias, h0, c0 = autocast_cast((input, weights, bias, *state))
    # The forward op checks every argument (its fake implementation too, for torch.compile and
    # export), naming the bad one; here only what the op cannot see: non-tensors, and T = 0,
    # which never reaches it.
    if not (isinstance(input, Tensor) and isinstance(weights, Tensor) and isinstance(bias, Tensor)
            and isinstance(h0, Tensor) and isinstance(c0, Tensor)) or input.dim() != 3 or input.shape[0] == 0:
        _check_sequence_args(input, weights, bias, h0, c0)
        return input.new_empty(0, input.shape[1], h0.shape[1]), (h0, c0)
    if has_tangent((input, weights, bias, h0, c0)):  # forward mode: torch's formulas, right to any order
        _check_sequence_args(input, weights, bias, h0, c0)
        return _sequence_differentiable(input, weights, bias, h0, c0)
    if DIRECT_WITHOUT_GRAD and no_gradient_wanted((input, weights, bias, h0, c0)):
        run = torch.ops.pyroundlib.lltm_sequence_inference.default  # no node: no gradient is wanted
    else:
        run = function_for(torch.ops.pyroundlib.lltm_sequence_forward.default, _LLTMSequenceNoJvp, LLTMSequenceFunction)
    output, c_n, *_ = run(input, weights, bias, h0, c0)
    return output, (output[-1], c_n)


def __getattr__(name):
    # LLTMLayer lived here until 0.4.0; it is pyroundlib.LLTMLayer (pyroundlib/layer.py)
    if name == "LLTMLayer":
        from .layer import LLTMLayer
        return LLTMLayer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
