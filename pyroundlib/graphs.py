"""Replaying a per-step loop as a CUDA graph: the whole loop in one launch from Python.

A sequence's loop launches a few kernels per step; from Python each launch costs host
time that the small GEMMs and pointwise kernels cannot hide.  ``run(loop, inputs,
outputs)`` captures ``loop(*inputs, *outputs)`` once per shape (on its second call: the
first runs eagerly and warms cuBLAS up) into a ``torch.cuda.CUDAGraph`` over private copies
of the tensors, and later calls copy the inputs in, replay the graph and copy the outputs
out, all on the current stream.  The C entry points never synchronise, so the loop can be
captured.

Runs the loop as it is (no graph) on the CPU, while another capture is under way (then
the loop is captured into that one: CUDA graphs, ``torch.compile(mode="reduce-overhead")``),
and when ``PYROUNDLIB_CUDA_GRAPHS=0`` is set.  A graph is kept per loop, device, stream,
shapes and dtypes, at most ``MAX_GRAPHS`` of them (least recently used dropped).
"""
import os
import threading
from collections import OrderedDict

import torch

ENV_VAR = "PYROUNDLIB_CUDA_GRAPHS"
MAX_GRAPHS = 16


class _Captured:
    """A loop captured over static copies of its tensors."""

    def __init__(self, loop, inputs, outputs):
        self.inputs = [t.clone() for t in inputs]
        self.outputs = [torch.empty_like(t) for t in outputs]
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):  # other threads may run CUDA work
            loop(*self.inputs, *self.outputs)

    def __call__(self, inputs, outputs) -> None:
        for static, t in zip(self.inputs, inputs):
            static.copy_(t)
        self.graph.replay()
        for t, static in zip(outputs, self.outputs):
            t.copy_(static)


_lock = threading.Lock()
_graphs: "OrderedDict[tuple, object]" = OrderedDict()


def enabled() -> bool:
    return os.environ.get(ENV_VAR, "1") not in ("0", "")


def run(loop, inputs, outputs) -> None:
    """``loop(*inputs, *outputs)``: the loop writes ``outputs`` (contiguous tensors) from
    ``inputs``; replayed from a CUDA graph where that is possible (see the module)."""
    first = inputs[0]
    if not first.is_cuda or not enabled() or torch.cuda.is_current_stream_capturing():
        loop(*inputs, *outputs)
        return
    stream = torch.cuda.current_stream(first.device)
    key = (loop, first.device, stream.cuda_stream) + tuple((t.shape, t.dtype) for t in (*inputs, *outputs))
    with _lock:  # one thread at a time enqueues copies and replays of the shared static tensors
        entry = _graphs.get(key)
        if entry is None:  # first call: run eagerly (this also warms cuBLAS up for the capture)
            loop(*inputs, *outputs)
            _remember(key, "seen")
            return
        if entry == "seen":
            entry = _Captured(loop, inputs, outputs)
            _remember(key, entry)
        else:
            _graphs.move_to_end(key)
        entry(inputs, outputs)


def _remember(key, entry) -> None:
    _graphs[key] = entry
    _graphs.move_to_end(key)
    while len(_graphs) > MAX_GRAPHS:
        _graphs.popitem(last=False)


def clear() -> None:
    """Drop every captured graph (and the memory its static tensors hold)."""
    with _lock:
        _graphs.clear()
