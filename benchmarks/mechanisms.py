"""What each speed mechanism is worth: the benchmark's rows with and without it, interleaved.

    python benchmarks/mechanisms.py [--rounds 11] [--only TEXT|TEXT] [--out benchmarks/results/mechanisms]

Each case is a row of the README's performance table; its variants are pyroundlib as it is
("with all") and pyroundlib with one mechanism switched off, plus the row's peer, timed as
``bench.py`` times them (interleaved rounds in a fresh random order, medians, the median of
per-round ratios).  A mechanism is switched off by patching the package for the duration of
each call (attributes set and restored around the call, the same wrapper around "with all"),
never by a setting the package carries for the benchmark's sake.  Sequence cases also record
memory: the peak above the baseline during one forward+backward, and what the library still
holds (reserved by its graphs and pools) once the call's results are dropped.

Writes mechanisms.json and mechanisms.md to --out; benchmarks/NOTES.md holds the decisions.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402
from bench import OURS, Case, RoundInFunction, run_case  # noqa: E402

import pyroundlib  # noqa: E402
from pyroundlib import _common, _threads, graphs, lltm, round as round_module, sequence  # noqa: E402
from pyroundlib.reference import lltm_cell_reference  # noqa: E402

WITH_ALL = OURS  # pyroundlib as it is


class Patch:
    """Attributes (owner, name, value) and environment variables set for one call, then restored."""

    def __init__(self, attrs=(), env=None, before=None, after=None):
        self.attrs, self.env, self.before, self.after = list(attrs), dict(env or {}), before, after

    def __enter__(self):
        self.saved = [(owner, name, getattr(owner, name)) for owner, name, _ in self.attrs]
        for owner, name, value in self.attrs:
            setattr(owner, name, value)
        self.saved_env = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        if self.before is not None:
            self.before()

    def __exit__(self, *exc):
        if self.after is not None:
            self.after()
        for owner, name, value in reversed(self.saved):
            setattr(owner, name, value)
        for k, v in self.saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def under(patch: Patch, fn):
    def call():
        with patch:
            return fn()
    return call


# ---- the mechanisms, each as a Patch that switches it off -------------------------------------

def route_fixed(route):
    """Every sequence call takes ``route`` (sequence.FUSED, ONE_CALL, REPLAYED or STEPS)."""
    return (sequence, "_route", lambda *args: route)


def kernels_absent(query):
    """``_route`` decides as if the kernels behind ``query`` never fit: the call takes the
    route it would take without them."""
    fits = sequence._fits
    return (sequence, "_fits", lambda cache, q, *args: False if q == query else fits(cache, q, *args))


def loop_twins():
    """New identities for the two step loops: graphs are keyed by the loop, so a variant that
    captures differently must not replay another variant's graphs."""
    fwd, bwd = sequence._forward_loop, sequence._backward_loop
    return [(sequence, "_forward_loop", lambda *a: fwd(*a)), (sequence, "_backward_loop", lambda *a: bwd(*a))]


def graphs_over_copies_only():
    """Graphs captured over private copies only: no capture over the call's own tensors, no
    memory pool for them (the allocator as usual)."""
    def run_on_device(loop, tensors, inputs, copies_pay):
        first = tensors[0]
        key = (loop, first.device, _common.current_stream_handle(first.get_device()), graphs._matmul_settings(),
               tuple((t.shape, t.dtype) for t in tensors))
        with graphs._lock:
            graph = graphs._graphs.get(key)
            if graph is None:
                if graphs._seen.get(key, 0) < 1:
                    loop(*tensors)
                    graphs._see(key)
                    return
                graph = graphs._remember(key, graphs._OverCopies(loop, tensors, inputs))
            graph(tensors)
    return [(graphs, "_run_on_device", run_on_device), (graphs, "buffers", lambda t: contextlib.nullcontext())]


def plain_signature(*functions):
    """Function.forward's signature computed per call (inspect), not once."""
    attrs = []
    for f in functions:
        attrs.append((f.forward, "__signature__", None))
    return attrs


def general_signature(*functions):
    """The signature computed once, but bound by inspect's general ``bind``."""
    import inspect
    return [(f.forward, "__signature__", inspect.Signature(list(inspect.signature(f.forward).parameters.values())))
            for f in functions]


def public_stream():
    return [(_common, "current_stream_handle", _common.public_stream_handle)]


def differentiable_op_in_forward():
    """The eager Functions' forwards call the differentiable ops (torch.library's autograd
    wrapper runs), not their ``_no_autograd`` twins."""
    ops = torch.ops.pyroundlib

    return [(round_module.RoundSTEFunction, "forward", staticmethod(lambda x: ops.round_ste(x))),
            (lltm.LLTMPointwiseFunction, "forward", staticmethod(lambda g, c: ops.lltm_forward(g, c))),
            (sequence.LLTMSequenceFunction, "forward",
             staticmethod(lambda i, w, b, h, c: ops.lltm_sequence_forward(i, w, b, h, c)))]


class ClassicRound(torch.autograd.Function):
    """A mechanism not in the package, measured to decide: round_ste's Function in the classic
    style (``forward(ctx, x)``, no ``setup_context``), which torch.func refuses."""

    @staticmethod
    def forward(ctx, x):
        return torch.ops.pyroundlib.round_ste_no_autograd.default(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


def classic_round():
    return [(round_module, "RoundSTEFunction", ClassicRound)]


def cpu_one_thread():
    """The CPU loop on the calling thread alone: what runs where no OpenMP runtime is found."""
    lib = pyroundlib._ffi.library()
    given = _threads._given
    saved = {}

    def before():
        _threads.follow_torch()  # the state as it is, then the same without the runtime
        saved.update(given)
        lib.prl_set_cpu_parallel(None)
        lib.prl_set_cpu_threads(1)

    def after():
        lib.prl_set_cpu_parallel(saved["parallel"] or None)
        lib.prl_set_cpu_threads(saved["threads"])
        given.update(saved)

    # follow_torch sees torch's count unchanged and leaves the one-thread setting alone
    return Patch(before=before, after=after)


# ---- cases -------------------------------------------------------------------------------------

def sequence_case(device, size, label, variants_off):
    """The README's sequence row: forward+backward, wall time per call, against nn.LSTM."""
    dtype, tf32 = bench.SEQUENCE_PRECISIONS.get(label, (torch.float32, None))
    steps, batch, features, state = size
    ours, cudnn, _ = bench.sequence_calls(device, steps, batch, features, state, dtype)
    variants = {WITH_ALL: under(Patch(), ours), bench.CUDNN: cudnn}
    for name, patch in variants_off.items():
        variants[name] = under(patch, ours)
    prefix = "CPU: " if device.type == "cpu" else ""
    tag = f"({steps},{batch},{features},{state})"
    case = Case(f"{prefix}sequence fwd+bwd {tag} {label}", variants, group="sequence", host_bound=True,
                settings=bench.tf32_settings(tf32))
    case.memory = (ours, cudnn, variants_off) if device.type == "cuda" else None
    return case


def round_cases(device, numel, variants_off):
    x = torch.randn(numel, device=device) * 4
    xg = x.clone().requires_grad_()
    g = torch.ones_like(x)
    tag = bench.numel_name(numel)
    fwd = {WITH_ALL: under(Patch(), lambda: pyroundlib.round_ste(x)), "torch.round": lambda: torch.round(x)}
    both = {WITH_ALL: under(Patch(), lambda: torch.autograd.grad(pyroundlib.round_ste(xg), xg, g)),
            "torch.round in autograd.Function": lambda: torch.autograd.grad(RoundInFunction.apply(xg), xg, g),
            "torch.round (no autograd)": lambda: torch.round(x)}
    for name, patch in variants_off.items():
        fwd[name] = under(patch, lambda: pyroundlib.round_ste(x))
        both[name] = under(patch, lambda: torch.autograd.grad(pyroundlib.round_ste(xg), xg, g))
    return [Case(f"round forward {tag} float32", fwd, host_bound=True),
            Case(f"round_ste fwd+bwd {tag} float32", both, host_bound=numel <= 2**20)]


def cell_case(device, size, variants_off):
    batch, features, state = size
    args = bench.lltm_inputs(device, batch, features, state, requires_grad=True)
    grads = [torch.randn(batch, state, device=device) for _ in range(2)]

    def fb(f):
        return lambda: torch.autograd.grad(f(*args), args, grads)

    variants = {WITH_ALL: under(Patch(), fb(pyroundlib.lltm_cell)), "eager": fb(lltm_cell_reference)}
    for name, patch in variants_off.items():
        variants[name] = under(patch, fb(pyroundlib.lltm_cell))
    return Case(f"LLTM cell fwd+bwd {size}", variants, host_bound=True)


def memory_of(fn, patch: Patch, calls: int = 4) -> tuple[float, float]:
    """(peak MB above the baseline during the last of ``calls`` calls, a training loop's steady
    state; MB still reserved after the calls once their results are dropped), from a clean
    state: graphs cleared, cache emptied."""
    graphs.clear()
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base_alloc, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    for _ in range(calls):
        torch.cuda.reset_peak_memory_stats()
        with patch:
            out = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base_alloc
        del out
    gc.collect()
    torch.cuda.empty_cache()
    held = torch.cuda.memory_reserved() - base_reserved
    graphs.clear()
    gc.collect()
    torch.cuda.empty_cache()
    return peak / 2**20, held / 2**20


FUSED_FITS, PERSISTENT_FITS = "prl_lltm_sequence_fused_cuda_fits", "prl_lltm_sequence_cuda_fits"


def build_cases(device, quick=False):
    host = {  # per-call host path: every row where host time bounds the call
        "no _no_autograd twin": Patch(differentiable_op_in_forward()),
        "signature per call": Patch(plain_signature(round_module.RoundSTEFunction, lltm.LLTMPointwiseFunction,
                                                    sequence.LLTMSequenceFunction)),
        "general bind": Patch(general_signature(round_module.RoundSTEFunction, lltm.LLTMPointwiseFunction,
                                                sequence.LLTMSequenceFunction)),
        "public stream query": Patch(public_stream()),
    }
    cases = []
    gpu = device.type == "cuda"
    if gpu:
        rounds = {**host, "(added) classic-style round Function": Patch(classic_round())}
        cases += round_cases(device, 2**12, rounds)
        cases += round_cases(device, 2**20, rounds)[1:]
        cases.append(cell_case(device, (16, 32, 128), host))
        small = host
        for label in ("float32 TF32 off", "bfloat16"):
            cases.append(sequence_case(device, (8, 32, 8, 64), label, {
                **(small if label != "bfloat16" else {}),
                "no fused kernels (the next route)": Patch([kernels_absent(FUSED_FITS)] + loop_twins()),
                "no fused kernels, replayed steps": Patch([route_fixed(sequence.REPLAYED)] + loop_twins())}))
        cases.append(sequence_case(device, (50, 64, 256, 512), "float32 TF32 off", {
            "no persistent kernels (the next route)": Patch([kernels_absent(PERSISTENT_FITS)] + loop_twins()),
            "no persistent kernels, replayed steps": Patch([route_fixed(sequence.REPLAYED)] + loop_twins())}))
        sizes = [(50, 64, 256, 512)] + ([] if quick else [(100, 256, 512, 1024)])
        for size in sizes:
            for label in ("bfloat16", "float32 TF32 off", "float32 TF32 on"):
                if size == (50, 64, 256, 512) and label != "bfloat16":
                    continue
                off = {"no graphs": Patch(env={graphs.ENV_VAR: "0"}),
                       "graphs over copies only": Patch(graphs_over_copies_only() + loop_twins())}
                cases.append(sequence_case(device, size, label, off))
    cpu = torch.device("cpu")
    cases.append(sequence_case(cpu, (8, 32, 8, 64), "float32", {
        "steps (no library loop)": Patch([route_fixed(sequence.STEPS)]),
        "library loop on one thread": cpu_one_thread(),
        "no _no_autograd twin": Patch(differentiable_op_in_forward()),
    }))
    return cases


def markdown(meta, rows, memory):
    out = [f"# Mechanisms — {meta['device']}, {meta['date']}", "",
           f"torch {meta['torch']}, pyroundlib {meta['pyroundlib']}, {meta['rounds']} interleaved rounds; "
           "time = median per call (host-bound rows: wall time per call); "
           "'/ with all' = median over rounds of that variant / pyroundlib as it is "
           "(above 1: the mechanism saves time); '/ peer' = that variant / the row's peer.", "",
           "| row | variant | time | / with all | / peer |", "|---|---|---:|---:|---:|"]
    for r in rows:
        peer = r["peer"]
        for i, (name, t) in enumerate(r["medians"].items()):
            vs_all = f"{r['vs_all'][name]:.3f}" if name in r["vs_all"] else "—"
            vs_peer = f"{r['vs_peer'][name]:.3f}" if name in r["vs_peer"] else "—"
            out.append(f"| {r['case'] if i == 0 else ''} | {name} | {bench.fmt_time(t)} | {vs_all} | {vs_peer} |")
    if memory:
        out += ["", "## Memory (one forward+backward; MB)", "",
                "| row | variant | peak above baseline | held after the call |", "|---|---|---:|---:|"]
        for case, entries in memory.items():
            for i, (name, (peak, held)) in enumerate(entries.items()):
                out.append(f"| {case if i == 0 else ''} | {name} | {peak:,.0f} | {held:,.0f} |")
    return "\n".join(out) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "mechanisms"))
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(0)
    cases = [c for c in build_cases(device, args.quick) if any(p in c.name for p in args.only.split("|"))]
    rows, memory, notes = [], {}, []
    for case in cases:
        on = torch.device("cpu") if case.name.startswith("CPU") else device
        with bench.case_settings(case, notes):
            result = run_case(case, on, args.rounds, 0.02)
            mem = getattr(case, "memory", None)
            if mem is not None:
                ours, cudnn, off = mem
                entries = {WITH_ALL: memory_of(ours, Patch()), bench.CUDNN: memory_of(cudnn, Patch())}
                for name, patch in off.items():
                    entries[name] = memory_of(ours, patch)
                memory[case.name] = entries
        peer = list(case.variants)[1]  # the row's peer comes right after pyroundlib as it is
        row = {"case": case.name, "peer": peer, "medians": result.medians,
               "vs_all": {n: statistics.median(a / b for a, b in zip(result.times[n], result.times[WITH_ALL]))
                          for n in case.variants if n != WITH_ALL},
               "vs_peer": {n: statistics.median(a / b for a, b in zip(result.times[n], result.times[peer]))
                           for n in case.variants if n != peer}}
        rows.append(row)
        print(f"{case.name}: " + ", ".join(f"{n} {bench.fmt_time(t)} ({row['vs_all'].get(n, 1.0):.3f})"
                                           for n, t in result.medians.items()), flush=True)
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
            "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "pyroundlib": pyroundlib.__version__, "rounds": args.rounds, "cpu_threads": torch.get_num_threads(),
            "settings": notes}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "mechanisms.json").write_text(json.dumps({"meta": meta, "rows": rows, "memory": memory}, indent=1))
    md = markdown(meta, rows, memory)
    (out / "mechanisms.md").write_text(md)
    print()
    print(md)


if __name__ == "__main__":
    main()
