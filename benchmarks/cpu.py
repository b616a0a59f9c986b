"""pyroundlib on the CPU against its PyTorch peers, side by side, in one run.

    python benchmarks/cpu.py [--quick] [--only TEXT] [--out benchmarks/results/cpu]

The cases (float32 unless named):
- the LLTM over a sequence, ``lltm_sequence`` against ``nn.LSTM`` of the same T, B, I, S
  (oneDNN's LSTM where torch has it), forward+backward and inference
  (``torch.inference_mode``), over CPU_SEQUENCE_SIZES: the default route beside each
  forced one (PYROUNDLIB_PERSISTENT_SEQUENCE=1, the library loop; =0, the step loop);
- ``round_ste``'s forward against ``torch.round``, 2^16 to 2^24 elements, every dtype;
- the LLTM cell's pointwise kernels against the same pointwise math in eager torch ops,
  at a large batch.

Method as bench.py's (interleaved rounds in a fresh random order, a warm-up, medians, the
median of per-round ratios), timed with perf_counter on torch's default threads.  Writes
results.json and results.md to --out, named by the machine (``<out>/<cpus>-core``).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import OURS, Case, fmt_time, run_case  # noqa: E402

import pyroundlib  # noqa: E402  (bench put the source tree on sys.path where none is installed)
from pyroundlib.lltm import (_backward_differentiable, _lltm_backward, _lltm_forward,  # noqa: E402
                             _pointwise_differentiable)
from pyroundlib.sequence import PERSISTENT_ENV_VAR  # noqa: E402

LSTM = "nn.LSTM"
FORCED = {"library loop (=1)": "1", "step loop (=0)": "0"}
# (T, B, I, S) over the range T 8-100, B 1-64, I and S 8-256: the corners and the middle, and
# the three sizes first measured
CPU_SEQUENCE_SIZES = [
    (8, 32, 8, 64), (50, 64, 64, 128), (30, 4, 256, 256),
    (100, 1, 8, 8), (100, 64, 256, 256), (8, 1, 256, 256), (100, 1, 256, 256),
    (20, 16, 32, 32), (64, 8, 128, 64), (16, 64, 16, 256), (100, 32, 64, 128),
    (30, 16, 256, 256), (100, 12, 64, 256),
]
ROUND_SIZES = [2**16, 2**20, 2**24]
ROUND_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
POINTWISE_SIZE = (4096, 1024)  # (B, S)


def cpu_model() -> str:
    """The CPU's model name where the system tells it (Linux: /proc/cpuinfo), else its
    architecture: the same torch and sizes give other ratios on another CPU."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


@contextlib.contextmanager
def env_var(name, value):
    """The environment variable `name` set to `value` (None: unset) inside the block."""
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def route_env(value):
    return env_var(PERSISTENT_ENV_VAR, value)


def sequence_cases(steps, batch, features, state):
    kw = dict(dtype=torch.float32)
    x = torch.randn(steps, batch, features, **kw, requires_grad=True)
    weights = (torch.randn(3 * state, state + features, **kw) / math.sqrt(state)).requires_grad_()
    bias = (torch.randn(3 * state, **kw) * 0.1).requires_grad_()
    h0, c0 = torch.randn(batch, state, **kw), torch.randn(batch, state, **kw)
    grad = torch.randn(steps, batch, state, **kw)
    lstm = torch.nn.LSTM(features, state)
    lstm_params = [x] + list(lstm.parameters())
    lstm_state = (h0.unsqueeze(0), c0.unsqueeze(0))

    def ours(route=None):
        def run():
            with route_env(route):
                output, _ = pyroundlib.lltm_sequence(x, weights, bias, (h0, c0))
                return torch.autograd.grad(output, [x, weights, bias], grad)
        return run

    def ours_inference(route=None):
        def run():
            with route_env(route), torch.inference_mode():
                return pyroundlib.lltm_sequence(x, weights, bias, (h0, c0))
        return run

    def lstm_train():
        output, _ = lstm(x, lstm_state)
        return torch.autograd.grad(output, lstm_params, grad)

    def lstm_inference():
        with torch.inference_mode():
            return lstm(x, lstm_state)

    tag = f"(T,B,I,S)=({steps},{batch},{features},{state})"
    train = {OURS: ours(), LSTM: lstm_train, **{name: ours(v) for name, v in FORCED.items()}}
    infer = {OURS: ours_inference(), LSTM: lstm_inference, **{name: ours_inference(v) for name, v in FORCED.items()}}
    return [Case(f"sequence fwd+bwd, {tag}", train, group="sequence", host_bound=True),
            Case(f"sequence inference, {tag}", infer, group="sequence-inference", host_bound=True)]


THROUGH_FUNCTION = "through the Function"  # round_ste with RoundSTEFunction.apply, as when a gradient is wanted


def round_case(numel, dtype):
    x = torch.randn(numel, dtype=dtype) * 4
    tag = f"2^{int(math.log2(numel))} {str(dtype).replace('torch.', '')}"

    def through_function():
        direct = pyroundlib.round.DIRECT_WITHOUT_GRAD
        pyroundlib.round.DIRECT_WITHOUT_GRAD = False
        try:
            return pyroundlib.round_ste(x)
        finally:
            pyroundlib.round.DIRECT_WITHOUT_GRAD = direct
    return Case(f"round forward, {tag}", {OURS: lambda: pyroundlib.round_ste(x), "torch.round": lambda: torch.round(x),
                                          THROUGH_FUNCTION: through_function}, group="round", host_bound=True)


def pointwise_cases(batch, state):
    gates, old_cell = torch.randn(batch, 3 * state), torch.randn(batch, state)
    grad_h, grad_cell = torch.randn(batch, state), torch.randn(batch, state)
    tag = f"(B,S)=({batch},{state})"

    def eager_backward():
        d_gates, d_cell = _backward_differentiable(grad_h, grad_cell, gates, old_cell)
        return d_gates, d_cell, d_gates.sum(0)

    return [Case(f"LLTM pointwise forward, {tag}", {OURS: lambda: _lltm_forward(gates, old_cell),
                                                     "eager": lambda: _pointwise_differentiable(gates, old_cell)},
                 group="pointwise", host_bound=True),
            Case(f"LLTM pointwise backward (with d_bias), {tag}",
                 {OURS: lambda: _lltm_backward(grad_h, grad_cell, gates, old_cell, with_bias=True),
                  "eager": eager_backward}, group="pointwise", host_bound=True)]


# The targets: ours / peer at most this (a forced route: the default at most 10% slower than it)
LIMITS = {LSTM: 0.75, "torch.round": 1.1, "eager": 1.1, THROUGH_FUNCTION: 1.1, **{name: 1.1 for name in FORCED}}


def targets(results) -> list:
    return [dict(case=r.case, peer=peer, ratio=ratio, limit=LIMITS[peer], met=ratio <= LIMITS[peer])
            for r in results for peer, ratio in r.ratios.items()]


def markdown(meta, results) -> str:
    lines = [f"# pyroundlib on the CPU: {meta['cpu']}, {meta['cpus']} CPUs, {meta['threads']} torch threads",
             "", f"torch {meta['torch']}, Python {meta['python']}, pyroundlib {meta['pyroundlib']}, "
             f"{meta['date']}; BLAS handed to the library: {meta['blas']}; {meta['rounds']} rounds.",
             "", "Ratio: the median over rounds of our time / the peer's (below 1: ours is faster); "
             "targets: nn.LSTM 0.75, torch.round and eager 1.1, a forced route 1.1 (the default at most 10% "
             "slower than it); a ratio over its target is marked *.", ""]
    groups = {}
    for r in results:
        groups.setdefault(r.group, []).append(r)
    for group, rows in groups.items():
        peers = [n for n in rows[0].medians if n != OURS]
        lines += [f"## {group}", "", "| case | " + " | ".join([OURS] + peers) + " | " +
                  " | ".join(f"ours / {p}" for p in peers) + " |", "|---" * (1 + 2 * len(peers) + 1) + "|"]
        for r in rows:
            lines.append(f"| {r.case} | " + " | ".join(fmt_time(r.medians[n]) for n in [OURS] + peers) + " | " +
                         " | ".join(f"{r.ratios[p]:.3f}" + ("" if r.ratios[p] <= LIMITS[p] else " *")
                                    for p in peers) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="5 rounds")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--only", default="", help="only the cases whose name contains one of these texts ('|')")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "cpu"))
    args = parser.parse_args(argv)
    rounds = args.rounds or (5 if args.quick else 11)
    torch.manual_seed(0)
    cases = [c for size in CPU_SEQUENCE_SIZES for c in sequence_cases(*size)]
    cases += [round_case(n, dtype) for dtype in ROUND_DTYPES for n in ROUND_SIZES]
    cases += pointwise_cases(*POINTWISE_SIZE)
    cases = [c for c in cases if any(part in c.name for part in args.only.split("|"))]
    results = []
    for case in cases:
        result = run_case(case, torch.device("cpu"), rounds, 0.05)
        results.append(result)
        print(f"{case.name}: " + ", ".join(f"{n} {fmt_time(t)}" for n, t in result.medians.items()) + "; "
              + ", ".join(f"/{n} {v:.3f}" for n, v in result.ratios.items()), flush=True)
    from pyroundlib import _threads
    meta = {"cpu": cpu_model(), "cpus": os.cpu_count(),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version(),
            "pyroundlib": pyroundlib.__version__, "date": datetime.date.today().isoformat(), "rounds": rounds,
            "blas": "yes" if _threads._given["gemm"] and _threads._given["gemm"][0] else "no"}
    out = Path(args.out) / f"{os.cpu_count()}-core"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "results": [r.__dict__ for r in results],
                                                  "targets": targets(results)}, indent=1))
    md = markdown(meta, results)
    (out / "results.md").write_text(md)
    print()
    print(md)


if __name__ == "__main__":
    main()
