"""A/B of pyroundlib trees in alternating fresh processes: the harness the records' A/B
scripts share (a record keeps only its worker).

A record's script calls ``ab.main(__file__, rounds, ["NAME=TREE", ...])``; each round runs the
script as ``SCRIPT worker`` once per tree, with ``PYTHONPATH=TREE`` (the library stays the one
``PYROUNDLIB_LIBRARY`` names, unless the tree is given as ``TREE@LIBRARY``: then that library),
the trees' order reversed every other round. The worker prints
one line ``JSON{"name": milliseconds, ...}``. Printed: each name's median per tree, and the
median (min-max) over rounds of its ratio to the first tree, the baseline; where the worker
timed a peer beside its own case ("NAME ours" and "NAME nn.LSTM"), each tree's ratio of the two
within a worker."""
import json
import os
import statistics
import subprocess
import sys


def cuda_time(f, calls: int = 2, reps: int = 5, warmup: int = 5) -> float:
    """Milliseconds a call of f on the current CUDA stream: CUDA events around ``calls`` calls,
    the median of ``reps``, after ``warmup`` calls."""
    import torch
    for _ in range(warmup):
        f()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            f()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def stacks(features: int, state: int, **kw):
    """("ours", a 2-layer bidirectional ``LLTMLayer``) and ("nn.LSTM", the same ``nn.LSTM``)."""
    import torch
    import pyroundlib
    return (("ours", pyroundlib.LLTMLayer(features, state, num_layers=2, bidirectional=True, **kw)),
            ("nn.LSTM", torch.nn.LSTM(features, state, num_layers=2, bidirectional=True, **kw)))


def stack_training(layer, x, lengths, packed: bool):
    """A call of a stacked layer (``LLTMLayer`` or ``nn.LSTM``) on x [T, B, I], packed by
    lengths (``enforce_sorted=False``) or padded, and the gradients of its output's, h_n's and
    c_n's sums in x and every parameter."""
    import torch
    from torch.nn.utils.rnn import pack_padded_sequence

    def train():
        given = pack_padded_sequence(x, lengths, enforce_sorted=False) if packed else x
        output, (h, c) = layer(given)
        output = output.data if packed else output
        torch.autograd.grad(output.sum() + h.sum() + c.sum(), [x, *layer.parameters()])
    return train


def main(script: str, rounds: int, names_trees) -> dict:
    """Runs the rounds; -> {tree name: [the worker's dict of each round]}."""
    trees = dict(nt.split("=", 1) for nt in names_trees)
    names = list(trees)
    times = {n: [] for n in names}
    for r in range(rounds):
        for which in (names if r % 2 == 0 else names[::-1]):
            tree, _, library = trees[which].partition("@")
            env = dict(os.environ, PYTHONPATH=tree, **({"PYROUNDLIB_LIBRARY": library} if library else {}))
            p = subprocess.run([sys.executable, script, "worker"], env=env, capture_output=True, text=True)
            line = [l for l in p.stdout.splitlines() if l.startswith("JSON")]
            if not line:
                print(which, "failed", p.stdout[-2000:], p.stderr[-3000:], flush=True)
                continue
            times[which].append(json.loads(line[0][4:]))
        print("round", r, "done", flush=True)
    base = times[names[0]]
    for k in base[0]:
        line = f"{k}: {names[0]} {statistics.median(a[k] for a in base):.3f} ms"
        for name in names[1:]:
            ratios = [b[k] / a[k] for a, b in zip(base, times[name])]
            line += (f" | {name} {statistics.median(b[k] for b in times[name]):.3f} ms, /{names[0]} "
                     f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
        print(line, flush=True)
    for name, runs in times.items():
        for k in runs[0]:
            if k.endswith(" ours") and k[:-len(" ours")] + " nn.LSTM" in runs[0]:
                r = [a[k] / a[k[:-len(" ours")] + " nn.LSTM"] for a in runs]
                print(f"{name}: {k[:-len(' ours')]} / nn.LSTM {statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f})",
                      flush=True)
    return times


def cli(script: str, worker) -> None:
    """A record's command line: ``SCRIPT worker`` runs worker(); ``SCRIPT main ROUNDS NAME=TREE ...``
    the rounds (main)."""
    if sys.argv[1] == "worker":
        worker()
    else:
        main(script, int(sys.argv[2]), sys.argv[3:])
