"""pyroundlib benchmark: both ops against their PyTorch peers, side by side, in one run.

    python benchmarks/bench.py [--device cuda|cpu] [--quick] [--out benchmarks/results]

Method (see benchmarks/NOTES.md): the variants of a case run interleaved in rounds, in a
fresh (seeded) random order each round (A B C, C A B, ...), each timing `reps`
back-to-back calls between two CUDA events (or perf_counter on the CPU) after a warm-up,
so host-bound small sizes measure host time per call and large sizes GPU time.
Reported: the median time of each variant, achieved GB/s where the bytes are known, and
the median of the per-round ratios pyroundlib / peer (drift between rounds cancels in
the ratio).

Writes results.json, results.md and ratios.png (if matplotlib is there) to --out.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import importlib
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

try:  # an installed pyroundlib, or the one on PYTHONPATH (`make bench` sets it)
    import pyroundlib
except ImportError:  # run from a source tree: the package beside this folder
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import pyroundlib
from pyroundlib.lltm import _lltm_backward, _lltm_forward  # noqa: E402
from pyroundlib.reference import lltm_cell_reference, round_ste_reference  # noqa: E402

OURS = "pyroundlib"
ORDER_SEED = 0  # the rounds' variant orders: the same in every run
KERNELS_FLOOR = "floor: GEMMs + our 2 kernel calls"


class LLTMFloor(torch.autograd.Function):
    """What any LLTM built on torch's GEMMs must do at least: the cat, the three matrix
    products and the bias sum, in one autograd node, with no pointwise work at all.
    Timed beside the others to show the floor under the CPU target (benchmarks/NOTES.md).
    Both floors are written as leanly as `lltm_cell` (one `linear`, one `split_with_sizes`)
    and applied as it is, through `Function.apply`."""

    @staticmethod
    def forward(ctx, input, weights, bias, old_h, old_cell):
        X = torch.cat([old_h, input], dim=1)
        gates = torch.nn.functional.linear(X, weights, bias)
        ctx.save_for_backward(X, weights, gates)
        state = old_h.shape[1]
        return gates[:, :state], gates[:, state:2 * state]

    @staticmethod
    def backward(ctx, grad_h, grad_cell):
        X, weights, d_gates = ctx.saved_tensors
        state = grad_h.shape[1]
        d_old_h, d_input = d_gates.mm(weights).split_with_sizes([state, X.shape[1] - state], dim=1)
        return d_input, d_gates.t().mm(X), d_gates.sum(0), d_old_h, grad_cell


class LLTMKernelsFloor(torch.autograd.Function):
    """The GEMMs-only floor plus pyroundlib's two kernel calls and the tensors they write:
    the least that any LLTM launching its pointwise kernels from Python must do, with no
    custom-op dispatch and no checks.  `lltm_cell` adds its argument checks and the
    torch.library dispatch of its two ops to this."""

    @staticmethod
    def forward(ctx, input, weights, bias, old_h, old_cell):
        X = torch.cat([old_h, input], dim=1)
        gates = torch.nn.functional.linear(X, weights, bias)
        new_h, new_cell = _lltm_forward(gates, old_cell)
        ctx.save_for_backward(X, weights, gates, old_cell)
        return new_h, new_cell

    @staticmethod
    def backward(ctx, grad_h, grad_cell):
        X, weights, gates, old_cell = ctx.saved_tensors
        d_gates, d_old_cell, d_bias = _lltm_backward(grad_h, grad_cell, gates, old_cell, with_bias=True)
        state = old_cell.shape[1]
        d_old_h, d_input = d_gates.mm(weights).split_with_sizes([state, X.shape[1] - state], dim=1)
        return d_input, d_gates.t().mm(X), d_bias, d_old_h, d_old_cell


class RoundInFunction(torch.autograd.Function):
    """torch.round with an identity backward, as Brevitas writes its STE."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


@dataclass
class Case:
    name: str
    variants: dict[str, Callable[[], object]]
    bytes_moved: dict[str, int] = field(default_factory=dict)  # per variant, for GB/s
    group: str = ""
    host_bound: bool = False  # small sizes: timed on the host, many calls and one synchronise
    settings: list = field(default_factory=list)  # (owner, name, value): set while the case runs


@dataclass
class Result:
    case: str
    group: str
    medians: dict[str, float]          # seconds per call
    ratios: dict[str, float]           # median over rounds of t(ours) / t(peer)
    gbps: dict[str, float]
    rounds: int
    reps: int
    times: dict[str, list[float]] = field(default_factory=dict)  # seconds per call, each round

    def ratio(self, a: str, b: str) -> float:
        return median_ratio(self.times, a, b)


def median_ratio(times: dict[str, list[float]], a: str, b: str) -> float:
    """Median over rounds of t(a) / t(b): the statistic of every ratio reported."""
    return statistics.median(x / y for x, y in zip(times[a], times[b]))


class Timer:
    """CUDA events around `reps` calls for GPU-bound cases; perf_counter around `reps`
    calls and one synchronise for host-bound ones (and on the CPU).

    As `timeit` does, the garbage collector is off while a round is timed (a collection
    lands on whichever variant happens to run then).  GPU-bound rounds start behind a
    `torch.cuda._sleep` kernel long enough for the host to enqueue all `reps` calls
    first, so the events time the GPU work alone, not the host's head start: without it,
    the first call's host time (tens of us of Python) is counted as GPU idle time."""

    def __init__(self, device: torch.device, host: bool = False):
        self.cuda = device.type == "cuda"
        self.events = self.cuda and not host
        self.lead = 0.0  # seconds of host time to cover with the sleep kernel
        self.cycles_per_second = _sleep_rate() if self.events else 0.0

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def __call__(self, fn, reps: int) -> float:
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._time(fn, reps)
        finally:
            if gc_was_enabled:
                gc.enable()

    def _time(self, fn, reps: int) -> float:
        if self.events:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.sync()
            torch.cuda._sleep(int(self.lead * self.cycles_per_second))
            t0 = time.perf_counter()
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            # Capped: when `reps` calls launch more kernels than the GPU's launch queue
            # holds, the host waits behind the sleep itself, and an uncapped lead would grow
            # by half every round.  Work that needs a longer lead is host-bound anyway.
            self.lead = min(max(self.lead, 1.5 * (time.perf_counter() - t0) + 200e-6), MAX_LEAD_SECONDS)
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / reps
        self.sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        self.sync()
        return (time.perf_counter() - t0) / reps


_SLEEP_RATE: list[float] = []
MAX_LEAD_SECONDS = 0.05


def _sleep_rate() -> float:
    """Cycles per second of torch.cuda._sleep on this GPU (measured once)."""
    if not _SLEEP_RATE:
        cycles = 10_000_000
        torch.cuda._sleep(cycles)  # warm-up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _SLEEP_RATE.append(cycles / (start.elapsed_time(end) / 1e3))
    return _SLEEP_RATE[0]


def run_case(case: Case, device: torch.device, rounds: int, round_seconds: float) -> Result:
    timer = Timer(device, host=case.host_bound)
    names = list(case.variants)
    for fn in case.variants.values():  # warm-up: compile, autotune, allocate
        for _ in range(3):
            fn()
    timer.sync()
    slowest = max(timer(fn, 1) for fn in case.variants.values())
    reps = max(1, min(2000, math.ceil(round_seconds / max(slowest, 1e-7))))
    for fn in case.variants.values():
        timer(fn, reps)
    times = {n: [] for n in names}
    # A fresh order each round, so that every variant runs in every position and after
    # every other variant: a fixed cycle (A B C, B C A, ...) gives each variant the same
    # predecessor in every round, and at the small LLTM sizes the variant run right after
    # eager measured 2-9% slower than the same function run elsewhere (benchmarks/NOTES.md).
    shuffler = random.Random(ORDER_SEED)
    for _ in range(rounds):
        for n in shuffler.sample(names, len(names)):
            times[n].append(timer(case.variants[n], reps))
    medians = {n: statistics.median(t) for n, t in times.items()}
    gbps = {n: case.bytes_moved[n] / medians[n] / 1e9 for n in names if n in case.bytes_moved}
    ratios = {n: median_ratio(times, OURS, n) for n in names if n != OURS}
    return Result(case.name, case.group, medians, ratios, gbps, rounds, reps, times)


# ---- cases -----------------------------------------------------------------------------------

def round_cases(device, numel, dtype, compiled_idiom):
    x = torch.randn(numel, device=device, dtype=dtype) * 4
    y = torch.empty_like(x)
    nbytes = 2 * x.numel() * x.element_size()
    tag = f"{numel_name(numel)} {str(dtype).replace('torch.', '')}"
    forward = Case(f"round forward, {tag}", {
        OURS: lambda: pyroundlib.round_ste(x),
        "torch.round": lambda: torch.round(x),
        "copy (same bytes)": lambda: y.copy_(x),
    }, {OURS: nbytes, "torch.round": nbytes, "copy (same bytes)": nbytes}, group="round", host_bound=numel <= 2**20)

    xg = x.clone().requires_grad_()
    g = torch.ones_like(x)

    def fwd_bwd(f):
        return lambda: torch.autograd.grad(f(xg), xg, g)

    ste = Case(f"round_ste forward+backward, {tag}", {
        OURS: fwd_bwd(pyroundlib.round_ste),
        "idiom eager": fwd_bwd(round_ste_reference),
        "idiom compiled": fwd_bwd(compiled_idiom),
        "torch.round in autograd.Function": fwd_bwd(RoundInFunction.apply),
        "copy (same bytes)": lambda: y.copy_(x),
    }, {n: nbytes for n in (OURS, "torch.round in autograd.Function", "copy (same bytes)")}, group="round",
        host_bound=numel <= 2**20)
    return [forward, ste]


def lltm_inputs(device, batch, features, state, dtype=torch.float32, requires_grad=False):
    shapes = [(batch, features), (3 * state, state + features), (3 * state,), (batch, state), (batch, state)]
    return [torch.randn(s, device=device, dtype=dtype).requires_grad_(requires_grad) for s in shapes]


def lltm_cases(device, batch, features, state, compiled_ref, pointwise=False, floor=False):
    tag = f"(B,I,S)=({batch},{features},{state})"
    host_bound = batch * state <= 256 * 1024
    args = lltm_inputs(device, batch, features, state)
    forward = Case(f"LLTM forward, {tag}", {
        OURS: lambda: pyroundlib.lltm_cell(*args),
        "eager": lambda: lltm_cell_reference(*args),
        "compiled": lambda: compiled_ref(*args),
    }, group="lltm", host_bound=host_bound)
    gargs = lltm_inputs(device, batch, features, state, requires_grad=True)
    grads = [torch.randn(batch, state, device=device) for _ in range(2)]

    def fwd_bwd(f):
        return lambda: torch.autograd.grad(f(*gargs), gargs, grads)

    both = Case(f"LLTM forward+backward, {tag}", {
        OURS: fwd_bwd(pyroundlib.lltm_cell),
        "eager": fwd_bwd(lltm_cell_reference),
        "compiled": fwd_bwd(compiled_ref),
    }, group="lltm", host_bound=host_bound)
    if floor:
        both.variants["floor: GEMMs only"] = fwd_bwd(LLTMFloor.apply)
        both.variants[KERNELS_FLOOR] = fwd_bwd(LLTMKernelsFloor.apply)
    cases = [forward, both]
    if pointwise:
        # the fused pointwise kernels alone against a copy moving the same number of bytes
        n, size = batch * state, 4
        gates = torch.randn(batch, 3 * state, device=device)
        old_cell, gh, gc = (torch.randn(batch, state, device=device) for _ in range(3))
        src_f, src_b = torch.randn(3 * n, device=device), torch.randn(5 * n, device=device)
        dst_f, dst_b = torch.empty_like(src_f), torch.empty_like(src_b)
        cases.append(Case(f"LLTM pointwise forward kernel, {tag}", {
            OURS: lambda: _lltm_forward(gates, old_cell),
            "copy (same bytes)": lambda: dst_f.copy_(src_f),
        }, {OURS: 6 * n * size, "copy (same bytes)": 6 * n * size}, group="lltm-kernels"))
        cases.append(Case(f"LLTM pointwise backward kernel, {tag}", {
            OURS: lambda: _lltm_backward(gh, gc, gates, old_cell),
            "copy (same bytes)": lambda: dst_b.copy_(src_b),
        }, {OURS: 10 * n * size, "copy (same bytes)": 10 * n * size}, group="lltm-kernels"))
    return cases


# The sizes of the sequence cases: (T, B, I, S).
SEQUENCE_SIZES = [(8, 32, 8, 64), (50, 64, 256, 512), (100, 256, 512, 1024)]
# the layer's too, and a wide state at a moderate batch: where the kernels do not fit and a padded
# layer runs its two directions in lockstep (pyroundlib.layer.LOCKSTEP_MAX_WORK)
LAYER_SIZES = SEQUENCE_SIZES + [(200, 64, 128, 768)]
# float32 twice (like with like: TF32 off on both sides, then on for both), bfloat16 as it is
SEQUENCE_PRECISIONS = {"float32 TF32 off": (torch.float32, False), "float32 TF32 on": (torch.float32, True),
                       "bfloat16": (torch.bfloat16, None)}
CUDNN = "nn.LSTM"  # cuDNN's fused LSTM on a GPU
CELL_LOOP = "lltm_cell loop"


def tf32_settings(tf32):
    """TF32 for torch's matmuls and for cuDNN, both on or both off (None: leave them)."""
    if tf32 is None:
        return []
    return [(torch.backends.cuda.matmul, "allow_tf32", tf32), (torch.backends.cudnn, "allow_tf32", tf32)]


def cell_loop(cell):
    """The cell stepped over the sequence in Python: (input, weights, bias, h0, c0) -> output."""
    def loop(input, weights, bias, h0, c0):
        h, c, outs = h0, c0, []
        for x in input.unbind(0):
            h, c = cell(x, weights, bias, h, c)
            outs.append(h)
        return torch.stack(outs)
    return loop


def sequence_calls(device, steps, batch, features, state, dtype):
    """(ours, cudnn, tensors): forward+backward over one sequence by lltm_sequence and by
    nn.LSTM of the same T, B, I, S, on fresh random data; tensors = (x, weights, bias, h0, c0,
    the output's gradient)."""
    kw = dict(device=device, dtype=dtype)
    x = torch.randn(steps, batch, features, **kw, requires_grad=True)
    weights = (torch.randn(3 * state, state + features, **kw) / math.sqrt(state)).requires_grad_()
    bias = torch.zeros(3 * state, **kw, requires_grad=True)
    h0, c0 = torch.randn(batch, state, **kw), torch.randn(batch, state, **kw)
    grad = torch.randn(steps, batch, state, **kw)
    lstm = torch.nn.LSTM(features, state).to(**kw)
    lstm_params = [x] + list(lstm.parameters())

    def ours():
        output, _ = pyroundlib.lltm_sequence(x, weights, bias, (h0, c0))
        return torch.autograd.grad(output, [x, weights, bias], grad)

    def cudnn():
        output, _ = lstm(x, (h0.unsqueeze(0), c0.unsqueeze(0)))
        return torch.autograd.grad(output, lstm_params, grad)

    return ours, cudnn, (x, weights, bias, h0, c0, grad)


def sequence_cases(device, steps, batch, features, state, label, compiled=True):
    """Forward+backward over a whole sequence: lltm_sequence against cuDNN's LSTM of the same
    T, B, I, S and against cell loops; timed as wall time per sequence (host-bound calls
    included) and, on a GPU, as GPU time."""
    dtype, tf32 = SEQUENCE_PRECISIONS.get(label, (torch.float32, None))
    tag = f"(T,B,I,S)=({steps},{batch},{features},{state})"
    ours, cudnn, (x, weights, bias, h0, c0, grad) = sequence_calls(device, steps, batch, features, state, dtype)
    params = [x, weights, bias]

    def loop(fn):
        return lambda: torch.autograd.grad(fn(x, weights, bias, h0, c0), params, grad)

    variants = {OURS: ours, CUDNN: cudnn, CELL_LOOP: loop(cell_loop(pyroundlib.lltm_cell)),
                "cell loop eager": loop(cell_loop(lltm_cell_reference))}
    if compiled and device.type == "cuda":
        variants["cell loop compiled"] = loop(torch.compile(cell_loop(lltm_cell_reference), fullgraph=True,
                                                            mode="reduce-overhead"))
    settings = tf32_settings(tf32)
    name = f"LLTM sequence fwd+bwd, {tag}, {label}"
    cases = [Case(f"{name}, wall", variants, group="sequence", host_bound=True, settings=settings)]
    if device.type == "cuda":
        cases.append(Case(f"{name}, GPU time", dict(variants), group="sequence-gpu", settings=settings))
    return cases


LAYER_LABELS = ("float32 TF32 off", "bfloat16")  # the layer cases' precisions
PADDED = "pyroundlib, padded"  # in the packed cases: our layer on the same batch padded to T
OTHER_ROUTE = "pyroundlib, other route"  # in CUDA's layer cases: the route below the chosen one


@contextlib.contextmanager
def other_layer_route():
    """The layer's next route down while in the block: for a pack, the one-call loop where the
    layer takes the fused kernels, the step loop where it takes the one-call loop; where the
    kernels do not fit, padded or packed, a direction at a time where the layer runs a layer's
    two in lockstep (a padded batch's: each its lltm_sequence call); the with-and-without row of
    the chosen route (benchmarks/NOTES.md)."""
    routes, chosen = pyroundlib.sequence, pyroundlib.sequence._packed_route
    layouts = (pyroundlib.layer._Packed, pyroundlib.layer._Padded)
    lockstep = [layout.lockstep for layout in layouts]

    def other(t, steps, batch, features, state):
        return routes.ONE_CALL if chosen(t, steps, batch, features, state) is routes.FUSED else routes.STEPS
    routes._packed_route = other
    for layout in layouts:
        layout.lockstep = lambda self, *args: False
    try:
        yield
    finally:
        routes._packed_route = chosen
        for layout, original in zip(layouts, lockstep):
            layout.lockstep = original


def layer_cases(device, steps, batch, features, state, label, packed):
    """LLTMLayer as nn.LSTM is used: 2 layers, bidirectional, against nn.LSTM of the same
    configuration on the same batch, forward+backward and inference (torch.inference_mode).
    packed: sequence lengths drawn uniformly from [T/2, T] (seeded), the same PackedSequence
    for both, and our layer on the batch padded to T beside them."""
    dtype, tf32 = SEQUENCE_PRECISIONS[label]
    kw = dict(device=device, dtype=dtype)
    gen = torch.Generator().manual_seed(steps * 1000 + batch)
    ours = pyroundlib.LLTMLayer(features, state, num_layers=2, bidirectional=True, **kw)
    lstm = torch.nn.LSTM(features, state, num_layers=2, bidirectional=True, **kw)
    x = torch.randn(steps, batch, features, **kw, requires_grad=True)
    lengths = torch.randint(steps // 2, steps + 1, (batch,), generator=gen).tolist()
    lengths[0] = steps
    pack = torch.nn.utils.rnn.pack_padded_sequence(x.detach(), lengths, enforce_sorted=False)
    pack = torch.nn.utils.rnn.PackedSequence(pack.data.requires_grad_(), pack.batch_sizes, pack.sorted_indices,
                                             pack.unsorted_indices)  # its data a leaf, as x is
    source = pack if packed else x

    def train(layer, given):
        is_pack = isinstance(given, torch.nn.utils.rnn.PackedSequence)
        params = [given.data if is_pack else given, *layer.parameters()]

        def run():
            output, (h, c) = layer(given)
            return torch.autograd.grad((output.data if is_pack else output).sum() + h.sum() + c.sum(), params)
        return run

    def infer(layer, given):
        def run():
            with torch.inference_mode():
                return layer(given)
        return run

    tag = f"(T,B,I,S)=({steps},{batch},{features},{state}), {'packed' if packed else 'padded'}, {label}"
    cpu = "CPU: " if device.type == "cpu" else ""
    settings = tf32_settings(tf32)
    cases = []
    for kind, make in (("fwd+bwd", train), ("inference", infer)):
        variants = {OURS: make(ours, source), CUDNN: make(lstm, source)}
        if packed:
            variants[PADDED] = make(ours, x)
        if device.type == "cuda" and (packed or pyroundlib.layer._Padded(2, kind == "inference").lockstep(x, state)):
            run_chosen = make(ours, source)

            def run_other(run_chosen=run_chosen):
                with other_layer_route():
                    return run_chosen()
            variants[OTHER_ROUTE] = run_other
        cases.append(Case(f"{cpu}LLTMLayer 2-layer bidirectional {kind}, {tag}, wall", variants, group="layer",
                          host_bound=True, settings=settings))
    return cases


def numel_name(n):
    return f"2^{int(math.log2(n))}" if n & (n - 1) == 0 else str(n)


# ---- targets --------------------------------------------------------------------------------
# Large sizes: at copy bandwidth, level with the fused (compiled) peers.  Per-call host time
# at small sizes is reported, not targeted: there it measures the machine's thread
# placement more than the op (benchmarks/NOTES.md).

def targets(results: dict[str, Result], device_type: str):
    rows = []

    def add(case, peer, limit, what):
        r = results.get(case)
        if r is not None and peer in r.ratios:
            rows.append((what, r.ratios[peer], limit, r.ratios[peer] <= limit))

    for r in results.values():
        if r.group == "sequence" and r.case.endswith(", wall"):
            what = r.case.replace("LLTM sequence fwd+bwd, ", "sequence ").replace(", wall", "")
            add(r.case, CUDNN, 0.75 if r.case.startswith("CPU") else 0.5, f"{what} / {CUDNN}")
            if not r.case.startswith("CPU"):
                add(r.case, CELL_LOOP, 0.25, f"{what} / {CELL_LOOP}")
    for r in results.values():
        if r.group == "layer":
            add(r.case, CUDNN, 0.75, f"{r.case.replace(', wall', '')} / {CUDNN}")
            if PADDED in r.ratios:
                add(r.case, PADDED, 0.85, f"{r.case.replace(', wall', '')} / padded")
    if device_type == "cuda":
        for dt in ("float32", "bfloat16"):
            add(f"round forward, 2^28 {dt}", "copy (same bytes)", 1.05, f"round fwd 2^28 {dt} / copy")
            ste = f"round_ste forward+backward, 2^28 {dt}"
            add(ste, "copy (same bytes)", 1.05, f"STE fwd+bwd 2^28 {dt} / copy")
            add(ste, "idiom eager", 0.3, f"STE fwd+bwd 2^28 {dt} / idiom eager")
            add(ste, "idiom compiled", 0.95, f"STE fwd+bwd 2^28 {dt} / idiom compiled")
            add(ste, "torch.round in autograd.Function", 1.0, f"STE fwd+bwd 2^28 {dt} / autograd.Function")
        add("LLTM forward+backward, (B,I,S)=(4096,1024,4096)", "compiled", 1.0,
            "LLTM fwd+bwd (4096,1024,4096) / compiled")
        for k in ("forward", "backward"):
            r = results.get(f"LLTM pointwise {k} kernel, (B,I,S)=(4096,1024,4096)")
            if r:
                frac = r.gbps[OURS] / r.gbps["copy (same bytes)"]
                rows.append((f"LLTM {k} kernel bandwidth / copy bandwidth (at least)", frac, 0.8, frac >= 0.8))
    return rows


# ---- settings ---------------------------------------------------------------------------------

@contextlib.contextmanager
def setting(owner, name: str, value):
    """``owner.name = value`` inside the block, restored after it, even when the block
    raises.  Where this torch has no such setting, or refuses the value, the block runs
    without it and the returned note says so (the run's meta records it)."""
    note = {"setting": f"{getattr(owner, '__name__', type(owner).__name__)}.{name}", "wanted": value}
    try:
        old = getattr(owner, name)
        setattr(owner, name, value)
    except Exception as e:  # noqa: BLE001 - AttributeError, or a config module's own refusal
        note["applied"] = False
        note["why"] = f"{type(e).__name__}: {e}"
        yield note
        return
    note["applied"] = True
    try:
        yield note
    finally:
        setattr(owner, name, old)


def inductor_config():
    """torch.compile's config module, or None on a torch without one (``setting`` then
    records that it was not applied).  It is not public API: the benchmark only ever sets
    it through ``setting``."""
    try:
        return importlib.import_module("torch._inductor.config")
    except Exception:  # noqa: BLE001 - ImportError, or a broken optional dependency
        return None


# ---- output ----------------------------------------------------------------------------------

def fmt_time(s):
    return f"{s * 1e6:,.1f} us" if s < 1e-3 else f"{s * 1e3:,.3f} ms"


def allowed_cpus() -> list[int] | None:
    """The CPUs this process may run on (``taskset`` narrows them): host-bound timings
    depend on it (benchmarks/NOTES.md)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return None


def markdown(meta, results, target_rows):
    out = [f"# pyroundlib benchmark — {meta['device']}, {meta['date']}", "",
           f"torch {meta['torch']}, pyroundlib {meta['pyroundlib']}, {meta['rounds']} interleaved rounds per case, "
           "in a fresh random order each round; "
           "time = median per call: CUDA events for large sizes, host time per call (perf_counter over many "
           "calls, one synchronise) for small ones; ratio = median over rounds of pyroundlib / that variant "
           "(below 1: pyroundlib faster)."
           + (" **Diagnostic run: every backward on the calling thread** (not the targets' setting)."
              if meta.get("backward_thread") == "calling thread" else "")
           + (f" **Process pinned to CPU(s) {meta['cpus_allowed']}** of {meta['cpus']} (e.g. `taskset`)."
              if meta.get("cpus_allowed") and len(meta["cpus_allowed"]) < (meta.get("cpus") or 0) else ""), "",
           "| case | variant | time | GB/s | pyroundlib / variant |", "|---|---|---:|---:|---:|"]
    for r in results.values():
        for i, (name, t) in enumerate(r.medians.items()):
            gb = f"{r.gbps[name]:,.0f}" if name in r.gbps else ""
            ratio = f"{r.ratios[name]:.3f}" if name in r.ratios else "—"
            out.append(f"| {r.case if i == 0 else ''} | {name} | {fmt_time(t)} | {gb} | {ratio} |")
    if target_rows:
        out += ["", "## Targets", "", "| target | measured | limit | met |", "|---|---:|---:|---|"]
        for what, value, limit, ok in target_rows:
            out.append(f"| {what} | {value:.3f} | {limit} | {'yes' if ok else '**no**'} |")
    return "\n".join(out) + "\n"


def chart(results, path, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no chart")
        return False
    labels, values = [], []
    for r in results.values():
        for peer, ratio in r.ratios.items():
            labels.append(f"{r.case} — vs {peer}")
            values.append(ratio)
    fig, ax = plt.subplots(figsize=(11, 0.28 * len(labels) + 1.5))
    ax.barh(range(len(labels)), values, color=["tab:green" if v <= 1 else "tab:red" for v in values])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("time ratio pyroundlib / peer (log scale; < 1 = pyroundlib faster)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the longest labels are wider than tight_layout allows
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="fewer rounds, no 2^28 or (4096,1024,4096) cases")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--only", default="",
                        help="run only the cases whose name contains one of these texts, separated by '|'")
    parser.add_argument("--backward-on-calling-thread", action="store_true",
                        help="diagnostic, not the targets' setting: run every backward on the calling thread "
                             "(torch.autograd.set_multithreading_enabled(False)) instead of the autograd "
                             "engine's per-device thread, to show what the hand-off costs each variant")
    parser.add_argument("--no-compiled-sequences", action="store_true",
                        help="leave the torch.compile'd cell loop out of the sequence cases (it compiles ~30 s a size)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    rounds = args.rounds or (5 if args.quick else 21)
    round_seconds = 0.02
    info = pyroundlib.library_info()
    if device.type == "cuda" and not info["cuda"]:
        raise SystemExit("the library was built without CUDA: rebuild with nvcc on PATH")
    torch.manual_seed(0)
    # No background compile workers: torch.compile otherwise starts a pool of worker
    # processes at its first compile, which then shares the CPU with whatever is being
    # timed (a suspect, not a proven cause, of one run's CPU outlier: benchmarks/NOTES.md).
    with setting(inductor_config(), "compile_threads", 1) as note:
        return _run(args, device, rounds, round_seconds, info, [note])


@contextlib.contextmanager
def case_settings(case: Case, notes: list):
    """The case's settings applied inside the block (and restored after, even when it fails);
    each applied setting is noted."""
    with contextlib.ExitStack() as stack:
        for owner, name, value in case.settings:
            notes.append(dict(stack.enter_context(setting(owner, name, value)), case=case.name))
        yield


def run_cases(cases, device, rounds, round_seconds, notes) -> dict[str, Result]:
    """Each case on its device (the "CPU: " ones on the CPU), with its settings applied while
    it runs (``case_settings``)."""
    results: dict[str, Result] = {}
    for case in cases:
        on = torch.device("cpu") if case.name.startswith("CPU") else device
        with case_settings(case, notes):
            results[case.name] = run_case(case, on, rounds, round_seconds)
        print(f"{case.name}: " + ", ".join(f"{n} {fmt_time(t)}" for n, t in results[case.name].medians.items()),
              flush=True)
    return results


def _run(args, device, rounds, round_seconds, info, notes):
    compiled_idiom = torch.compile(round_ste_reference, dynamic=False)
    compiled_lltm = torch.compile(lltm_cell_reference, dynamic=False)
    cases: list[Case] = []
    if device.type == "cuda":
        sizes = [2**12, 2**20] + ([] if args.quick else [2**28])
        for dtype in (torch.float32, torch.bfloat16):
            for n in sizes:
                cases += round_cases(device, n, dtype, compiled_idiom)
        lltm_sizes = [(16, 32, 128), (256, 512, 1024)] + ([] if args.quick else [(4096, 1024, 4096)])
        for b, i, s in lltm_sizes:
            cases += lltm_cases(device, b, i, s, compiled_lltm, pointwise=(b, i, s) == (4096, 1024, 4096),
                                floor=b <= 256)
    else:
        for dtype in (torch.float32, torch.bfloat16):
            for n in (2**12, 2**20):
                cases += round_cases(device, n, dtype, compiled_idiom)
        cases += lltm_cases(device, 256, 512, 1024, compiled_lltm)
    if device.type == "cuda":
        for label in SEQUENCE_PRECISIONS:
            for t, b, i, s in SEQUENCE_SIZES[:2] if args.quick else SEQUENCE_SIZES:
                # the compiled loop takes ~30 s to compile per size: only in the like-with-like float32 case
                cases += sequence_cases(device, t, b, i, s, label, compiled=label == "float32 TF32 off"
                                        and not args.no_compiled_sequences)
    if device.type == "cuda":
        for label in LAYER_LABELS:
            for t, b, i, s in LAYER_SIZES[:2] if args.quick else LAYER_SIZES:
                for packed in (False, True):
                    cases += layer_cases(device, t, b, i, s, label, packed)
    cpu_sequence = sequence_cases(torch.device("cpu"), *SEQUENCE_SIZES[0], "float32")
    for case in cpu_sequence:
        case.name = "CPU: " + case.name
    for packed in (False, True):
        cpu_sequence += layer_cases(torch.device("cpu"), *SEQUENCE_SIZES[0], "float32 TF32 off", packed)
    # the CPU path at the tutorial's size, in every run
    cpu_case = lltm_cases(torch.device("cpu"), 16, 32, 128, compiled_lltm, floor=True)[1]
    cpu_case.name = "CPU: " + cpu_case.name
    cpu_case.variants.pop("compiled")  # the CPU target is against eager
    cpu_case.group = "cpu"

    cases = [c for c in cases + [cpu_case] + cpu_sequence if any(part in c.name for part in args.only.split("|"))]
    with torch.autograd.set_multithreading_enabled(not args.backward_on_calling_thread):
        results = run_cases(cases, device, rounds, round_seconds, notes)

    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "CPU")
    meta = {"device": device_name, "device_type": device.type, "date": datetime.date.today().isoformat(),
            "torch": torch.__version__, "pyroundlib": pyroundlib.__version__, "library": info, "rounds": rounds,
            "cpu_threads": torch.get_num_threads(), "python": platform.python_version(),
            "backward_thread": "calling thread" if args.backward_on_calling_thread else "autograd device thread",
            "cpus_allowed": allowed_cpus(), "cpus": os.cpu_count(), "settings": notes}
    target_rows = targets(results, device.type)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({
        "meta": meta, "results": [r.__dict__ for r in results.values()],
        "targets": [dict(target=w, measured=v, limit=lim, met=ok) for w, v, lim, ok in target_rows]}, indent=1))
    md = markdown(meta, results, target_rows)
    (out / "results.md").write_text(md)
    chart(results, out / "ratios.png", f"pyroundlib / peers — {device_name}, {meta['date']}")
    print()
    print(md)


if __name__ == "__main__":
    main()
