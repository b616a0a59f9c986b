"""Replaying a per-step loop as a CUDA graph: the whole loop in one launch from Python.

A sequence's loop launches a few kernels per step; from Python each launch costs host
time that small GEMMs and pointwise kernels cannot hide.  ``run(loop, tensors)`` runs
``loop(*tensors)``, which reads and writes only ``tensors`` (and temporaries of its own),
and remembers the call by its tensors' addresses, shapes and dtypes, the device and the
current stream.  When the same call comes again, which is what a training loop does
once the caching allocator hands out the same blocks each iteration, the loop is
captured into a ``torch.cuda.CUDAGraph`` and replayed from then on: a graph reads and
writes exactly the addresses it was captured with, which are this call's own live
tensors, so no copies are needed.  (The first sighting runs eagerly, which also warms
cuBLAS up for the capture.)  The C entry points never synchronise, so the loop can be
captured.

The loop runs as it is (no graph) on the CPU, while another capture is under way (then
it is captured into that one: CUDA graphs, ``torch.compile(mode="reduce-overhead")``), and
when ``PYROUNDLIB_CUDA_GRAPHS=0`` is set.  At most ``MAX_GRAPHS`` graphs are kept (least
recently used dropped, with the temporaries their private memory pools hold).
"""
import os
import threading
from collections import OrderedDict

import torch

ENV_VAR = "PYROUNDLIB_CUDA_GRAPHS"
MAX_GRAPHS = 16
_SEEN = object()  # a call seen once: not captured yet

_lock = threading.Lock()
_graphs: "OrderedDict[tuple, object]" = OrderedDict()


def enabled() -> bool:
    return os.environ.get(ENV_VAR, "1") not in ("0", "")


def run(loop, tensors) -> None:
    """``loop(*tensors)``, replayed from a CUDA graph where possible (see the module)."""
    first = tensors[0]
    if not first.is_cuda or not enabled() or torch.cuda.is_current_stream_capturing():
        loop(*tensors)
        return
    stream = torch.cuda.current_stream(first.device)
    key = (loop, first.device, stream.cuda_stream) + tuple((t.data_ptr(), t.shape, t.dtype) for t in tensors)
    with _lock:  # one thread at a time captures, and enqueues replays
        graph = _graphs.get(key)
        if graph is None:
            loop(*tensors)
            _remember(key, _SEEN)
            return
        if graph is _SEEN:
            graph = torch.cuda.CUDAGraph()
            # on the tensors' device; thread_local: other threads may run CUDA work meanwhile
            with torch.cuda.device(first.device), torch.cuda.graph(graph, capture_error_mode="thread_local"):
                loop(*tensors)
            _remember(key, graph)
        else:
            _graphs.move_to_end(key)
        graph.replay()  # on the current stream


def _remember(key, entry) -> None:
    _graphs[key] = entry
    _graphs.move_to_end(key)
    while len(_graphs) > MAX_GRAPHS:
        _graphs.popitem(last=False)


def clear() -> None:
    """Drop every captured graph (and the memory its pool holds)."""
    with _lock:
        _graphs.clear()
