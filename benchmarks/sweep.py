"""Long sequences on a GPU: lltm_sequence against cuDNN's nn.LSTM and FlashRNN over a sweep.

    python benchmarks/sweep.py [--rounds N] [--only TEXT] [--flashrnn SHAPES] [--out DIR]

Each case is one (T, B, I, S), one dtype (float32 with TF32 off on both sides, bfloat16)
and one mode (forward+backward of ``output.sum()`` into the input, weights and bias, or the
forward alone under ``torch.inference_mode``); its variants, timed side by side in
interleaved rounds as bench.py times them (a fresh random order each round, the median of
per-round ratios), as wall time per sequence (a synchronise after the round's calls):

- ``pyroundlib``: ``lltm_sequence`` on its default route;
- ``persistent (=1)``: the same call with PYROUNDLIB_PERSISTENT_SEQUENCE=1, where the
  persistent kernels fit (the default route is then the same or another);
- ``pyroundlib, float32``: in the bfloat16 cases, our default route on the same sequence in
  float32 (the target: bfloat16 no slower than float32);
- ``CUDA cores (TENSOR_CORES=0)``: in the bfloat16 cases, the default with
  PYROUNDLIB_TENSOR_CORES=0 (the persistent kernels' products on CUDA cores, not tensor cores);
- ``nn.LSTM``: cuDNN's LSTM of the same T, B, I, S and dtype;
- ``FlashRNN``: FlashRNN's fused LSTM (a published persistent kernel), timed as a user runs
  it: a Linear for its input projection, then its recurrence; only where importable and
  asked for (--flashrnn, it compiles its kernel for each batch, state and dtype on first use,
  20-90 s a shape: --prepare-flashrnn compiles them in parallel processes first). It is never
  a dependency of pyroundlib: ``../shared/peers/flashrnn.sh DIR`` and PYTHONPATH=DIR.

The LLTM does 3/4 of an LSTM's GEMM work: 0.75 of a peer's time is equal efficiency per FLOP.
Writes results.json and results.md to --out.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import math
import platform
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import OURS, Case, case_settings, fmt_time, run_case, tf32_settings  # noqa: E402
from cpu import env_var, route_env  # noqa: E402

import pyroundlib  # noqa: E402
from pyroundlib import sequence  # noqa: E402

LSTM, FLASHRNN = "nn.LSTM", "FlashRNN"
PERSISTENT, AS_FLOAT32 = "persistent (=1)", "pyroundlib, float32"
CUDA_CORES = "CUDA cores (TENSOR_CORES=0)"
# (T, B, I, S) over T 50-1000, B 1-64, I and S 64-512: corners, middles, and the rows first measured
SWEEP_SIZES = [
    (50, 1, 64, 64), (50, 64, 512, 512), (100, 16, 256, 256), (200, 32, 128, 256),
    (200, 8, 64, 512), (300, 64, 128, 128), (500, 4, 256, 256), (500, 32, 512, 512),
    (1000, 1, 128, 128), (1000, 16, 64, 64), (1000, 64, 256, 256), (100, 64, 64, 512),
]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MODES = ("fwd+bwd", "inference")


def flashrnn_available() -> bool:
    try:
        import flashrnn  # noqa: F401
        return True
    except Exception:  # noqa: BLE001 - ImportError, or its own import-time failure
        return False


def lltm_call(steps, batch, features, state, dtype, mode):
    kw = dict(device="cuda", dtype=dtype)
    train = mode == "fwd+bwd"
    x = torch.randn(steps, batch, features, **kw, requires_grad=train)
    weights = (torch.randn(3 * state, state + features, **kw) / math.sqrt(state)).requires_grad_(train)
    bias = (torch.randn(3 * state, **kw) * 0.1).requires_grad_(train)
    h0, c0 = torch.zeros(batch, state, **kw), torch.zeros(batch, state, **kw)

    def run():
        if not train:
            with torch.inference_mode():
                return pyroundlib.lltm_sequence(x, weights, bias, (h0, c0))
        output, _ = pyroundlib.lltm_sequence(x, weights, bias, (h0, c0))
        return torch.autograd.grad(output.sum(), [x, weights, bias])
    return run


def lstm_call(steps, batch, features, state, dtype, mode):
    kw = dict(device="cuda", dtype=dtype)
    train = mode == "fwd+bwd"
    x = torch.randn(steps, batch, features, **kw, requires_grad=train)
    lstm = torch.nn.LSTM(features, state).to(**kw)
    params = [x] + list(lstm.parameters())

    def run():
        if not train:
            with torch.inference_mode():
                return lstm(x)
        output, _ = lstm(x)
        return torch.autograd.grad(output.sum(), params)
    return run


def flashrnn_call(steps, batch, features, state, dtype, mode):
    """FlashRNN's fused LSTM with its defaults, input projection included: x [B, T, I]
    (its layout) through a Linear to the four gates' inputs [B, T, 4, 1, S], then the
    recurrence (one head of S)."""
    from flashrnn import flashrnn
    kw = dict(device="cuda", dtype=dtype)
    train = mode == "fwd+bwd"
    x = torch.randn(batch, steps, features, **kw, requires_grad=train)
    project = torch.nn.Linear(features, 4 * state).to(**kw)
    recurrent = (torch.randn(4, 1, state, state, **kw) / math.sqrt(state)).requires_grad_(train)
    bias = torch.zeros(4, 1, state, **kw, requires_grad=train)
    params = [x, recurrent, bias, *project.parameters()]
    name = "bfloat16" if dtype == torch.bfloat16 else "float32"

    def forward():
        gates = project(x).view(batch, steps, 4, 1, state)
        return flashrnn(gates, recurrent, bias, function="lstm", backend="cuda_fused", dtype=name)[0]

    def run():
        if not train:
            with torch.inference_mode():
                return forward()
        return torch.autograd.grad(forward().sum(), params)
    return run


def sweep_case(steps, batch, features, state, label, mode, with_flashrnn) -> Case:
    dtype = DTYPES[label]
    size = (steps, batch, features, state)
    variants = {OURS: lltm_call(*size, dtype, mode)}
    if sequence._fits(sequence._persistent_fits, "prl_lltm_sequence_cuda_fits",
                      torch.empty(0, device="cuda", dtype=dtype), batch, state):
        inner = lltm_call(*size, dtype, mode)

        def persistent():
            with route_env("1"):
                return inner()
        variants[PERSISTENT] = persistent
    if dtype != torch.float32:
        variants[AS_FLOAT32] = lltm_call(*size, torch.float32, mode)
        # the default with the 16-bit products on CUDA cores: the tensor cores' with-and-without
        with env_var(sequence.TENSOR_CORES_ENV_VAR, "0"):
            cuda_cores_fit = sequence._fits({}, "prl_lltm_sequence_cuda_fits",
                                            torch.empty(0, device="cuda", dtype=dtype), batch, state)
        if cuda_cores_fit:
            plain = lltm_call(*size, dtype, mode)

            def on_cuda_cores():
                with env_var(sequence.TENSOR_CORES_ENV_VAR, "0"):
                    return plain()
            variants[CUDA_CORES] = on_cuda_cores
    variants[LSTM] = lstm_call(*size, dtype, mode)
    if with_flashrnn:
        variants[FLASHRNN] = flashrnn_call(*size, dtype, mode)
    tag = f"(T,B,I,S)=({steps},{batch},{features},{state})"
    # TF32 off for float32 on both sides (and for the float32 variant of a bfloat16 case)
    return Case(f"sequence {mode}, {tag}, {label}", variants, group=f"{label} {mode}", host_bound=True,
                settings=tf32_settings(False))


def prepare_flashrnn(shapes, labels):
    """Compiles FlashRNN's kernels for each (shape, dtype) in parallel processes (they land in
    torch's extension cache, where the timed process finds them)."""
    jobs = [(size, label) for size in shapes for label in labels]
    code = ("import sys, torch; sys.path.insert(0, {here!r}); import sweep; "
            "sweep.flashrnn_call(*{size!r}, sweep.DTYPES[{label!r}], 'fwd+bwd')(); torch.cuda.synchronize()")

    def one(job):
        size, label = job
        proc = subprocess.run([sys.executable, "-c", code.format(here=str(Path(__file__).parent), size=size,
                                                                 label=label)],
                              capture_output=True, text=True, timeout=900)
        return size, label, proc.returncode, proc.stderr[-600:]
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        return [one_result for one_result in pool.map(one, jobs)]


def markdown(meta, results) -> str:
    lines = [f"# Long sequences: {meta['gpu']}", "",
             f"torch {meta['torch']}, Python {meta['python']}, pyroundlib {meta['pyroundlib']}, {meta['date']}; "
             f"{meta['rounds']} interleaved rounds; wall time per sequence; float32 with TF32 off on both sides. "
             "Ratio: the median over rounds of our time / the variant's (below 1: ours is faster); the route is "
             "the default's.", ""]
    groups = {}
    for r in results:
        groups.setdefault(r.group, []).append(r)
    for group, rows in groups.items():
        peers = [p for p in (PERSISTENT, AS_FLOAT32, CUDA_CORES, LSTM, FLASHRNN) if any(p in r.medians for r in rows)]
        lines += [f"## {group}", "", "| (T, B, I, S) | route | " + " | ".join([OURS] + peers) + " | " +
                  " | ".join(f"ours / {p}" for p in peers) + " |", "|---" * (2 + 2 * len(peers) + 1) + "|"]
        for r in rows:
            size = r.case.split("=")[1].split("),")[0] + ")"
            lines.append(f"| {size} | {meta['routes'][r.case]} | " + " | ".join(
                fmt_time(r.medians[n]) if n in r.medians else "" for n in [OURS] + peers) + " | " + " | ".join(
                f"{r.ratios[p]:.3f}" if p in r.ratios else "" for p in peers) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default="", help="only the cases whose name contains one of these texts ('|')")
    parser.add_argument("--flashrnn", default="", help="the sizes FlashRNN runs at: 'all', or indices into "
                        "SWEEP_SIZES, comma-separated ('' : none)")
    parser.add_argument("--prepare-flashrnn", action="store_true", help="compile FlashRNN's kernels first")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "sweep"))
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    with_flashrnn = set()
    if args.flashrnn and flashrnn_available():
        with_flashrnn = set(range(len(SWEEP_SIZES))) if args.flashrnn == "all" else \
            {int(i) for i in args.flashrnn.split(",")}
    elif args.flashrnn:
        print("FlashRNN is not importable: its column is left out", flush=True)
    notes = []
    if with_flashrnn and args.prepare_flashrnn:
        for size, label, rc, err in prepare_flashrnn([SWEEP_SIZES[i] for i in sorted(with_flashrnn)], DTYPES):
            print(f"FlashRNN {size} {label}: " + ("compiled" if rc == 0 else f"failed ({rc}): {err}"), flush=True)
            if rc != 0:
                notes.append(f"FlashRNN {size} {label} failed: {err}")
    cases = []  # (case, size, dtype label)
    for i, size in enumerate(SWEEP_SIZES):
        for label in DTYPES:
            for mode in MODES:
                case = sweep_case(*size, label, mode, i in with_flashrnn)
                if any(part in case.name for part in args.only.split("|")):
                    cases.append((case, size, label))
    results, routes, applied = [], {}, []
    for case, size, label in cases:
        with case_settings(case, applied):  # the route as the default takes it under the case's settings
            routes[case.name] = sequence._route(torch.empty(0, device="cuda", dtype=DTYPES[label]), *size,
                                                inference="inference" in case.name)
            try:
                result = run_case(case, torch.device("cuda"), args.rounds, 0.05)
            except Exception as e:  # noqa: BLE001 - a peer's failure is recorded, the sweep goes on
                if FLASHRNN not in case.variants:
                    raise
                notes.append(f"{case.name}: FlashRNN failed ({type(e).__name__}: {str(e)[:300]}); timed without it")
                del case.variants[FLASHRNN]
                result = run_case(case, torch.device("cuda"), args.rounds, 0.05)
        results.append(result)
        print(f"{case.name} [{routes[case.name]}]: " + ", ".join(f"{n} {fmt_time(t)}" for n, t in
                                                                  result.medians.items()) + "; " +
              ", ".join(f"/{n} {v:.3f}" for n, v in result.ratios.items()), flush=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
            "pyroundlib": pyroundlib.__version__, "date": datetime.date.today().isoformat(), "rounds": args.rounds,
            "routes": routes, "settings": applied, "notes": notes}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "results": [r.__dict__ for r in results]}, indent=1))
    md = markdown(meta, results) + "".join(f"\n- {n}" for n in notes)
    (out / "results.md").write_text(md)
    print()
    print(md)


if __name__ == "__main__":
    main()
