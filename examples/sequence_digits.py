"""Digits as sequences: ``pyroundlib.LLTMLayer`` against ``torch.nn.LSTM``.

Each 8x8 digit is read one row at a time, as a sequence of 8 time steps of 8 pixels.  A
recurrent layer carries a hidden state along the rows, and a Linear layer classifies the
digit from the final hidden state.  The same model is trained twice, identically (same
seed, batches, optimiser and epochs), once with ``pyroundlib.LLTMLayer`` (the LLTM cell
over the whole sequence as one op: its pointwise steps run in pyroundlib's native
kernels) and once with PyTorch's ``nn.LSTM`` (cuDNN's fused LSTM on a GPU) of the same
state size.  The LLTM is a simplified LSTM: three gate blocks instead of four and no forget
gate, so it has fewer parameters and its cell state only accumulates.  The two are trained
epoch by epoch in turn, so that whatever else runs on the machine slows both alike.

Runs on scikit-learn's bundled digits, on the GPU when PyTorch and pyroundlib both have
CUDA, else on the CPU.  Well under a minute on a 2-core CPU.  From the repository root,
after ``make`` (any folder works as long as ``pyroundlib`` is importable):

    PYTHONPATH=. python3 examples/sequence_digits.py [--epochs 60] [--out examples/output]

Reports test accuracy and training time per epoch of both layers; writes
``sequence_digits.png`` (training loss curves) and ``sequence_digits.json`` to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import Tensor, nn
from tqdm import tqdm

import pyroundlib

DEFAULT_OUT = Path(__file__).resolve().parent / "output"  # examples/output
SEED = 0
STATE_SIZE = 64
ROW_PIXELS = 8  # each time step is one row of 8 pixels; 8 rows = 8 time steps
CLASSES = 10
BATCH_SIZE = 64
LEARNING_RATE = 5e-3


class RowReader(nn.Module):
    """Reads images row by row with a recurrent layer and classifies from the final hidden state.

    ``layer`` is a batch-first module called as ``layer(input) -> (output, (h_n, c_n))``,
    as both ``pyroundlib.LLTMLayer`` and ``torch.nn.LSTM`` are (the state starts at zeros).
    """

    def __init__(self, layer: nn.Module, state_size: int = STATE_SIZE):
        super().__init__()
        self.layer = layer
        self.classify = nn.Linear(state_size, CLASSES)

    def forward(self, images: Tensor) -> Tensor:
        """images [batch, rows, pixels per row] -> logits [batch, classes]"""
        _, (h, _) = self.layer(images)
        return self.classify(h.reshape(len(images), -1))  # nn.LSTM's h_n has a leading layer dimension


def pick_device() -> torch.device:
    """CUDA only when both PyTorch and the native library have it."""
    use_cuda = torch.cuda.is_available() and pyroundlib.library_info()["cuda"]
    return torch.device("cuda" if use_cuda else "cpu")


def make_models(device: torch.device) -> dict[str, RowReader]:
    """The two contenders, each initialised from the same seed."""
    torch.manual_seed(SEED)
    lltm = RowReader(pyroundlib.LLTMLayer(ROW_PIXELS, STATE_SIZE, batch_first=True))
    torch.manual_seed(SEED)
    lstm = RowReader(nn.LSTM(ROW_PIXELS, STATE_SIZE, batch_first=True))
    return {"pyroundlib.LLTMLayer": lltm.to(device), "torch.nn.LSTM": lstm.to(device)}


def load_data(device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Digits as [n, 8 rows, 8 pixels] in [0, 1], as (x_train, y_train, x_test, y_test); a fixed 75/25 split."""
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.25, random_state=SEED, stratify=digits.target)
    return tuple(torch.as_tensor(a, device=device) for a in (x_train, y_train, x_test, y_test))


def train_epoch(model: nn.Module, optimizer: torch.optim.Optimizer,
                batches: list[tuple[Tensor, Tensor]]) -> tuple[float, float]:
    """One pass over ``batches``; returns (mean training loss, seconds taken)."""
    model.train()
    start = time.perf_counter()
    total = torch.zeros((), device=batches[0][0].device)
    for images, labels in batches:
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.detach() * len(images)
    mean_loss = total.item() / sum(len(images) for images, _ in batches)  # .item() waits for the GPU
    return mean_loss, time.perf_counter() - start


def train(models: dict[str, nn.Module], x_train: Tensor, y_train: Tensor,
          epochs: int) -> dict[str, dict[str, list[float]]]:
    """Train every model on the same shuffled batches, one epoch each in turn.

    Returns, per model, the mean training loss and the seconds of each epoch.
    """
    optimizers = {name: torch.optim.Adam(model.parameters(), lr=LEARNING_RATE) for name, model in models.items()}
    history = {name: {"loss": [], "seconds": []} for name in models}
    generator = torch.Generator().manual_seed(SEED)
    progress = tqdm(range(epochs), desc="training both", unit="epoch")
    for _ in progress:
        order = torch.randperm(len(x_train), generator=generator).to(x_train.device)
        batches = list(zip(x_train[order].split(BATCH_SIZE), y_train[order].split(BATCH_SIZE)))
        for name, model in models.items():
            loss, seconds = train_epoch(model, optimizers[name], batches)
            history[name]["loss"].append(loss)
            history[name]["seconds"].append(seconds)
        progress.set_postfix({name.split(".")[-1]: f"{h['loss'][-1]:.3f}" for name, h in history.items()})
    return history


@torch.no_grad()
def accuracy(model: nn.Module, images: Tensor, labels: Tensor) -> float:
    """Fraction of ``images`` classified as their label."""
    model.eval()
    return (model(images).argmax(dim=1) == labels).float().mean().item()


def save_loss_curves(results: dict[str, dict], path: Path) -> None:
    """Both models' mean training loss per epoch, on a log scale."""
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    for name, r in results.items():
        epochs = range(1, len(r["train_loss"]) + 1)
        ax.plot(epochs, r["train_loss"], marker=".", label=f"{name} (test accuracy {r['test_accuracy']:.1%})")
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel("mean training loss (cross-entropy, log scale)")
    ax.set_title(f"Digits read row by row, state size {STATE_SIZE}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=150)


def summary(report: dict) -> str:
    lines = [f"Digits read row by row (8 steps x 8 pixels), state size {STATE_SIZE}, {report['train_size']} train / "
             f"{report['test_size']} test, {report['epochs']} epochs on {report['device']}",
             f"{'layer':<20}  {'params':>6}  {'test accuracy':>13}  {'s/epoch (median)':>16}"]
    for name, r in report["models"].items():
        lines.append(f"{name:<20}  {r['parameters']:>6}  {r['test_accuracy']:>13.1%}  "
                     f"{r['median_epoch_seconds']:>16.3f}")
    lines += ["s/epoch: median training time of an epoch (forward, backward, optimiser step)",
              f"total time {report['seconds']:.1f} s"]
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=60, help="training epochs for each layer (default: 60)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="folder for the PNG and JSON (default: examples/output, next to this script)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    start = time.perf_counter()
    device = pick_device()
    x_train, y_train, x_test, y_test = load_data(device)
    models = make_models(device)
    history = train(models, x_train, y_train, args.epochs)

    results = {name: {"parameters": sum(p.numel() for p in model.parameters()),
                      "test_accuracy": accuracy(model, x_test, y_test),
                      "median_epoch_seconds": statistics.median(history[name]["seconds"]),
                      "total_train_seconds": sum(history[name]["seconds"]),
                      "train_loss": history[name]["loss"],
                      "epoch_seconds": history[name]["seconds"]}
               for name, model in models.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    save_loss_curves(results, args.out / "sequence_digits.png")
    report = {"device": str(device), "epochs": args.epochs, "seed": SEED, "state_size": STATE_SIZE,
              "train_size": len(x_train), "test_size": len(x_test), "models": results,
              "seconds": time.perf_counter() - start}
    (args.out / "sequence_digits.json").write_text(json.dumps(report, indent=2) + "\n")
    print(summary(report))
    print(f"wrote {args.out / 'sequence_digits.png'} and {args.out / 'sequence_digits.json'}")


if __name__ == "__main__":
    main()
