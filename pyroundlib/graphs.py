"""Replaying a per-step loop as a CUDA graph: the whole loop in one launch from Python.

A sequence's loop launches a few kernels per step; from Python each launch costs host
time that small GEMMs and pointwise kernels cannot hide.  ``run(loop, tensors, inputs)``
runs ``loop(*tensors)``, which reads the first ``inputs`` tensors, writes the others, and
touches nothing else but temporaries of its own.  The C entry points never synchronise,
so such a loop can be captured into a ``torch.cuda.CUDAGraph`` and replayed:

- The same call again (the same tensor addresses, shapes and dtypes, device and stream),
  which is what a training loop makes once the caching allocator hands out the same
  blocks each iteration: the loop is captured over the call's own tensors and replayed
  from then on, with no copies (a graph reads and writes exactly the addresses it was
  captured with, which are then this call's own live tensors).
- The same shapes with other tensors, for a loop long enough that copies pay: after the
  shape has been run twice as it is, the loop is captured over private copies, and a
  replay copies the inputs in and the outputs out (the copies cost host time and
  memory: one more set of the call's tensors per such graph).  A call replayed over copies
  that then repeats is captured over its own tensors as above: a training loop whose
  first iterations' tensors took other addresses (the optimiser's state allocated in the
  first step, say) runs without copies once its addresses settle.
- Otherwise the loop runs as it is (the first sighting also warms cuBLAS up for a
  capture); so does every call on the CPU, while another capture is under way (the loop
  is then captured into that one: CUDA graphs, ``torch.compile(mode="reduce-overhead")``),
  or with ``PYROUNDLIB_CUDA_GRAPHS=0`` in the environment.

Graphs are kept per loop, device, stream, matmul settings (TF32, reduced-precision
reductions: they pick the GEMM kernels a graph replays), shapes and dtypes; at most
``MAX_GRAPHS``, least recently used dropped (with the memory they hold).

A call's own tensors repeat their addresses only when the allocator's state does.  Where
other work allocates between two calls (large buffers especially, which the caching
allocator splits and merges), it does not, and every call would be replayed over copies
(at (T, B, I, S) = (100, 256, 512, 1024) in bfloat16 that is ~0.45 ms of copies a call on an
H100).  So the callers allocate the tensors a graph is keyed on inside ``buffers(t)``: in a
memory pool of their own per device (``torch.cuda.MemPool``, where this torch has it), in
which only these calls allocate, so that a call that repeats gets the same blocks again.
"""
import contextlib
import os
import threading
from collections import OrderedDict

import torch

from . import _common

ENV_VAR = "PYROUNDLIB_CUDA_GRAPHS"
MAX_GRAPHS = 32
MAX_SEEN = 256
SIGHTINGS_BEFORE_COPIES = 2  # shapes seen this often with other tensors get a graph over copies

_lock = threading.Lock()
_graphs: "OrderedDict[tuple, object]" = OrderedDict()  # captured graphs, least recently used first
_seen: "OrderedDict[tuple, int]" = OrderedDict()  # calls and shapes run as they are, how often


def enabled() -> bool:
    return os.environ.get(ENV_VAR, "1") not in ("0", "")


_MemPool = getattr(torch.cuda, "MemPool", None)  # public since torch 2.5 (feature-tested)
_use_mem_pool = getattr(torch.cuda, "use_mem_pool", None)
_pools: dict = {}  # device index -> the MemPool of the calls' tensors there


def buffers(t: torch.Tensor):
    """A context to allocate a call's tensors in (see the module): the pool of t's device,
    where graphs are replayed, this torch has memory pools, its allocator is the native
    caching allocator (``cudaMallocAsync`` has no pools) and no capture is under way (a
    capture allocates from its graph's pool); otherwise the allocator as usual."""
    if _use_mem_pool is None or _MemPool is None or not t.is_cuda or not enabled() \
            or torch.cuda.get_allocator_backend() != "native" or torch.cuda.is_current_stream_capturing():
        return contextlib.nullcontext()
    index = t.get_device()
    with _lock:
        pool = _pools.get(index)
        if pool is None:
            with torch.cuda.device(index):
                pool = _pools[index] = _MemPool()
    return _use_mem_pool(pool, index)


_capture_streams: dict = {}  # device index -> the side stream captures on that device run on


def _capture(loop, tensors, device: torch.device) -> "torch.cuda.CUDAGraph":
    """``loop(*tensors)`` captured into a new graph, on a side stream of the tensors' own
    device: ``torch.cuda.graph``'s default capture stream is made once, on whichever device
    was current at the process's first capture, and a capture for another device on it would
    record nothing (torch warns "The CUDA Graph is empty") while the loop ran uncaptured.
    thread_local: other threads may run CUDA work meanwhile.  The caller holds ``_lock``."""
    stream = _capture_streams.get(device.index)
    if stream is None:
        stream = _capture_streams[device.index] = torch.cuda.Stream(device)
    graph = torch.cuda.CUDAGraph()
    # Not torch.cuda.graph(): its entry synchronises and empties the allocator's cache, which
    # hands the free blocks of the calls' pool (buffers) back to the driver, so that the next
    # call's tensors can take new addresses and be replayed over copies from then on.
    with torch.cuda.stream(stream):
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            loop(*tensors)
        finally:
            graph.capture_end()
    return graph


class _OverCopies:
    """A loop captured over private copies of its tensors."""

    def __init__(self, loop, tensors, inputs: int):
        self.inputs = inputs
        # Normal tensors even when made under inference_mode: the graph outlives the call, and
        # a later call with gradients on copies into them (an in-place update of an inference
        # tensor outside inference_mode is an error).
        with torch.inference_mode(False):
            self.tensors = [t.clone() if k < inputs else torch.empty_like(t) for k, t in enumerate(tensors)]
        self.graph = _capture(loop, self.tensors, tensors[0].device)

    def __call__(self, tensors) -> None:
        for mine, t in zip(self.tensors[:self.inputs], tensors[:self.inputs]):
            mine.copy_(t)
        self.graph.replay()
        for t, mine in zip(tensors[self.inputs:], self.tensors[self.inputs:]):
            t.copy_(mine)


def _matmul_settings() -> tuple:
    """What decides which GEMM kernels torch picks, and so what a captured graph replays:
    a graph captured with TF32 off must not serve a call made with it on."""
    matmul = torch.backends.cuda.matmul
    return (torch.get_float32_matmul_precision(), matmul.allow_fp16_reduced_precision_reduction,
            matmul.allow_bf16_reduced_precision_reduction, torch.are_deterministic_algorithms_enabled())


def run(loop, tensors, inputs: int, copies_pay: bool) -> None:
    """``loop(*tensors)``, replayed from a CUDA graph where possible (see the module).
    ``copies_pay``: whether a graph over copies beats the loop run as it is (a short loop
    launches about as few kernels as the copies take)."""
    first = tensors[0]
    if not first.is_cuda:
        loop(*tensors)
        return
    # The one place a call enters its tensors' device: the capture, the replay (on that
    # device's current stream), the copies and the loop all happen there, whichever device
    # the caller has current and whichever device captured first.
    with torch.cuda.device(first.device):
        _run_on_device(loop, tensors, inputs, copies_pay)


def _run_on_device(loop, tensors, inputs: int, copies_pay: bool) -> None:
    first = tensors[0]
    if not enabled() or torch.cuda.is_current_stream_capturing():
        loop(*tensors)
        return
    shape = (loop, first.device, _common.current_stream_handle(first.get_device()), _matmul_settings(),
             tuple((t.shape, t.dtype) for t in tensors))
    call = shape + tuple(t.data_ptr() for t in tensors)
    with _lock:  # one thread at a time captures, and enqueues copies and replays
        graph = _graphs.get(call)
        if graph is None and call in _seen:  # this very call again: capture over its tensors
            graph = _remember(call, _capture(loop, tensors, first.device))
        if graph is not None:
            _graphs.move_to_end(call)
            graph.replay()  # on the current stream
            return
        over_copies = _graphs.get(shape)
        if over_copies is None and copies_pay and _seen.get(shape, 0) >= SIGHTINGS_BEFORE_COPIES:
            over_copies = _remember(shape, _OverCopies(loop, tensors, inputs))
        if over_copies is not None:
            _graphs.move_to_end(shape)
            over_copies(tensors)
            _see(call)  # should this call repeat, it is captured over its own tensors: no copies
            return
        loop(*tensors)
        _see(call)
        _see(shape)


def _remember(key, graph):
    _graphs[key] = graph
    while len(_graphs) > MAX_GRAPHS:
        _graphs.popitem(last=False)
    return graph


def _see(key) -> None:
    _seen[key] = _seen.pop(key, 0) + 1
    while len(_seen) > MAX_SEEN:
        _seen.popitem(last=False)


def clear() -> None:
    """Drop every captured graph (and the memory its pool holds), and the calls' pools."""
    with _lock:
        _graphs.clear()
        _seen.clear()
        _pools.clear()  # a pool's memory goes when its last tensor does
