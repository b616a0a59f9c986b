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
- The same shapes with other tensors: the loop is captured over private copies, and a
  replay copies the inputs in and the outputs out (the copies cost host time and
  memory: one more set of the call's tensors per such graph).
- The first call of a shape runs the loop as it is (which also warms cuBLAS up for a
  capture); so does every call on the CPU, while another capture is under way (the loop
  is then captured into that one: CUDA graphs, ``torch.compile(mode="reduce-overhead")``),
  or with ``PYROUNDLIB_CUDA_GRAPHS=0`` in the environment.

At most ``MAX_GRAPHS`` entries are kept, least recently used dropped (with the memory
their graphs hold).
"""
import os
import threading
from collections import OrderedDict

import torch

from . import _common

ENV_VAR = "PYROUNDLIB_CUDA_GRAPHS"
MAX_GRAPHS = 32
_SEEN = object()  # a call or a shape seen once: not captured yet

_lock = threading.Lock()
_graphs: "OrderedDict[tuple, object]" = OrderedDict()


def enabled() -> bool:
    return os.environ.get(ENV_VAR, "1") not in ("0", "")


def _capture(loop, tensors, device) -> "torch.cuda.CUDAGraph":
    graph = torch.cuda.CUDAGraph()
    # on the tensors' device; thread_local: other threads may run CUDA work meanwhile
    with torch.cuda.device(device), torch.cuda.graph(graph, capture_error_mode="thread_local"):
        loop(*tensors)
    return graph


class _OverCopies:
    """A loop captured over private copies of its tensors."""

    def __init__(self, loop, tensors, inputs: int):
        self.inputs = inputs
        self.tensors = [t.clone() if k < inputs else torch.empty_like(t) for k, t in enumerate(tensors)]
        self.graph = _capture(loop, self.tensors, tensors[0].device)

    def __call__(self, tensors) -> None:
        for mine, t in zip(self.tensors[:self.inputs], tensors[:self.inputs]):
            mine.copy_(t)
        self.graph.replay()
        for t, mine in zip(tensors[self.inputs:], self.tensors[self.inputs:]):
            t.copy_(mine)


def run(loop, tensors, inputs: int) -> None:
    """``loop(*tensors)``, replayed from a CUDA graph where possible (see the module)."""
    first = tensors[0]
    if not first.is_cuda or not enabled() or torch.cuda.is_current_stream_capturing():
        loop(*tensors)
        return
    where = (loop, first.device, _common.current_stream_handle(first.get_device()))
    shapes = tuple((t.shape, t.dtype) for t in tensors)
    call = where + shapes + tuple(t.data_ptr() for t in tensors)
    shape = where + shapes
    with _lock:  # one thread at a time captures, and enqueues copies and replays
        graph, over_copies = _graphs.get(call), _graphs.get(shape)
        if isinstance(graph, torch.cuda.CUDAGraph):
            _remember(call, graph)
            graph.replay()  # on the current stream
        elif isinstance(over_copies, _OverCopies):
            _remember(shape, over_copies)
            over_copies(tensors)
        elif graph is _SEEN:  # this very call again
            graph = _capture(loop, tensors, first.device)
            _remember(call, graph)
            graph.replay()
        elif over_copies is _SEEN:  # this shape again, with other tensors
            over_copies = _OverCopies(loop, tensors, inputs)
            _remember(shape, over_copies)
            over_copies(tensors)
        else:
            loop(*tensors)
            _remember(call, _SEEN)
            _remember(shape, _SEEN)


def _remember(key, entry) -> None:
    _graphs[key] = entry
    _graphs.move_to_end(key)
    while len(_graphs) > MAX_GRAPHS:
        _graphs.popitem(last=False)


def clear() -> None:
    """Drop every captured graph (and the memory its pool holds)."""
    with _lock:
        _graphs.clear()
