"""The adding problem: ``pyroundlib.LLTMLayer`` against ``torch.nn.LSTM`` on long, packed sequences.

A classic test of long-range memory (Hochreiter and Schmidhuber, 1997): each step of a
sequence holds a random number in [0, 1] and a marker; exactly two steps are marked, one in
each half, and the target is the sum of the two marked numbers.  Sequences are 50-200 steps
long, batched as ``PackedSequence``s (each sequence runs its own length, no padding).  The
model is a 2-layer bidirectional recurrent layer and a Linear read-out of the last layer's
final states (both directions); one with ``pyroundlib.LLTMLayer``, one with ``nn.LSTM`` of
the same configuration and (as near as the sizes allow) the same number of parameters, trained
identically (same seed, data, batches, optimiser), epoch by epoch in turn.  Predicting 1.0 for
every sequence gives a mean squared error of about 0.167: a model below that has learned to
carry the marked numbers to the end.

The LLTM's cell has no forget gate: each step adds ``elu(candidate) * sigmoid(input gate)`` to
the cell state, about 0.1 a step as the layer is initialised, so that after 200 steps the
state is about 25 in size and tanh, which reads it out, is flat (its slope about 0.03): no
gradient reaches the early steps.  The example therefore starts the LLTM's input gates nearly
closed (their biases at ``--input-gate-bias``, -3 by default: sigmoid(-3) = 0.05), as LSTMs
are often given a forget-gate bias; ``--input-gate-bias 0`` keeps the layer's own
initialisation.  The LSTM keeps its own.

On the GPU when PyTorch and pyroundlib both have CUDA, else on the CPU.  From the repository
root, after ``make``:

    PYTHONPATH=. python3 examples/adding_problem.py [--epochs 30] [--lr 1e-2] [--input-gate-bias -3] [--out examples/output]

Reports the test MSE and the training time per epoch of both; writes ``adding_problem.png``
(test MSE per epoch) and ``adding_problem.json`` to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from matplotlib.figure import Figure
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_sequence

import pyroundlib

DEFAULT_OUT = Path(__file__).resolve().parent / "output"
SEED = 0
LSTM_HIDDEN = 32
MIN_STEPS, MAX_STEPS = 50, 200
TRAIN, TEST, BATCH_SIZE = 2000, 500, 32
LEARNING_RATE = 1e-2
INPUT_GATE_BIAS = -3.0


def make_data(count: int, generator: torch.Generator) -> tuple[list[Tensor], Tensor]:
    """count sequences ([steps, 2]: value, marker) of random lengths, and their targets."""
    sequences, targets = [], []
    for _ in range(count):
        steps = int(torch.randint(MIN_STEPS, MAX_STEPS + 1, (), generator=generator))
        values = torch.rand(steps, generator=generator)
        first = int(torch.randint(0, steps // 2, (), generator=generator))
        second = int(torch.randint(steps // 2, steps, (), generator=generator))
        markers = torch.zeros(steps)
        markers[first] = markers[second] = 1.0
        sequences.append(torch.stack([values, markers], dim=1))
        targets.append(values[first] + values[second])
    return sequences, torch.stack(targets)


class Adder(nn.Module):
    """A recurrent layer over a PackedSequence, then a Linear read-out of the last layer's
    final states of both directions (``h_n[-2:]``)."""

    def __init__(self, layer: nn.Module, state_size: int):
        super().__init__()
        self.layer = layer
        self.read_out = nn.Linear(2 * state_size, 1)

    def forward(self, packed: PackedSequence) -> Tensor:
        _, (h_n, _) = self.layer(packed)
        return self.read_out(torch.cat([h_n[-2], h_n[-1]], dim=1)).squeeze(1)


def count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def make_models(device: torch.device, input_gate_bias: float = INPUT_GATE_BIAS) -> dict[str, Adder]:
    """nn.LSTM with LSTM_HIDDEN, and the LLTMLayer whose state size comes nearest its parameter
    count, its input gates' biases (the first S of each bias_l*) at input_gate_bias."""
    config = {"num_layers": 2, "bidirectional": True}
    torch.manual_seed(SEED)
    lstm = Adder(nn.LSTM(2, LSTM_HIDDEN, **config), LSTM_HIDDEN)
    budget = count(lstm)
    state = min(range(8, 4 * LSTM_HIDDEN), key=lambda s: abs(count(Adder(pyroundlib.LLTMLayer(2, s, **config), s))
                                                              - budget))
    torch.manual_seed(SEED)
    lltm = Adder(pyroundlib.LLTMLayer(2, state, **config), state)
    if input_gate_bias:
        with torch.no_grad():
            for name, parameter in lltm.layer.named_parameters():
                if name.startswith("bias_l"):
                    parameter[:state].fill_(input_gate_bias)
    return {f"pyroundlib.LLTMLayer (S={state})": lltm.to(device), f"torch.nn.LSTM (H={LSTM_HIDDEN})": lstm.to(device)}


def batches(sequences: list[Tensor], targets: Tensor, order: Tensor, device) -> list[tuple[PackedSequence, Tensor]]:
    out = []
    for chunk in order.split(BATCH_SIZE):
        chunk = chunk.tolist()
        packed = pack_sequence([sequences[i] for i in chunk], enforce_sorted=False).to(device)
        out.append((packed, targets[chunk].to(device)))
    return out


def train_epoch(model: nn.Module, optimizer, data) -> float:
    model.train()
    start = time.perf_counter()
    for packed, target in data:
        loss = nn.functional.mse_loss(model(packed), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


@torch.no_grad()
def test_mse(model: nn.Module, data) -> float:
    model.eval()
    errors = [nn.functional.mse_loss(model(packed), target, reduction="sum") for packed, target in data]
    return (torch.stack(errors).sum() / sum(len(t) for _, t in data)).item()


def save_curves(results: dict, path: Path) -> None:
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    for name, r in results.items():
        ax.plot(range(1, len(r["test_mse"]) + 1), r["test_mse"], marker=".", label=name)
    ax.axhline(1 / 6, color="grey", linestyle="--", label="predicting 1.0 (about 0.167)")
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel("test MSE (log scale)")
    ax.set_title(f"Adding problem, {MIN_STEPS}-{MAX_STEPS} steps, packed, 2 layers bidirectional", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=150)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--lr", type=float, default=LEARNING_RATE, help="Adam's learning rate, both models")
    parser.add_argument("--input-gate-bias", type=float, default=INPUT_GATE_BIAS,
                        help="the LLTM's input-gate biases at the start (0: the layer's own initialisation)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    start = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() and pyroundlib.library_info()["cuda"] else "cpu")
    generator = torch.Generator().manual_seed(SEED)
    train_x, train_y = make_data(TRAIN, generator)
    test_x, test_y = make_data(TEST, generator)
    test_data = batches(test_x, test_y, torch.arange(TEST), device)
    models = make_models(device, args.input_gate_bias)
    optimizers = {name: torch.optim.Adam(m.parameters(), lr=args.lr) for name, m in models.items()}
    results = {name: {"parameters": count(m), "test_mse": [], "epoch_seconds": []} for name, m in models.items()}
    for epoch in range(args.epochs):
        data = batches(train_x, train_y, torch.randperm(TRAIN, generator=generator), device)
        for name, model in models.items():  # in turn, so that whatever else runs slows both alike
            results[name]["epoch_seconds"].append(train_epoch(model, optimizers[name], data))
            results[name]["test_mse"].append(test_mse(model, test_data))
        print(f"epoch {epoch + 1}: " + ", ".join(f"{n.split(' ')[0]} {r['test_mse'][-1]:.4f}"
                                                for n, r in results.items()), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    save_curves(results, args.out / "adding_problem.png")
    report = {"device": str(device), "torch": torch.__version__, "epochs": args.epochs, "lr": args.lr,
              "input_gate_bias": args.input_gate_bias, "seed": SEED,
              "models": results, "seconds": time.perf_counter() - start}
    (args.out / "adding_problem.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'model':<34} {'params':>6} {'test MSE':>9} {'s/epoch (median)':>17}")
    for name, r in results.items():
        median = statistics.median(r["epoch_seconds"])
        print(f"{name:<34} {r['parameters']:>6} {r['test_mse'][-1]:>9.4f} {median:>17.2f}")
    print(f"wrote {args.out / 'adding_problem.png'} and {args.out / 'adding_problem.json'}")


if __name__ == "__main__":
    main()
