"""Binary codes for image retrieval: an autoencoder with a ``pyroundlib.RoundSTE`` bottleneck.

The encoder maps each 8x8 digit (64 pixels) to ``bits`` numbers in (0, 1) with a sigmoid;
``pyroundlib.RoundSTE()`` rounds them to 0 or 1, and the decoder rebuilds the image from
those bits alone.  Rounding has a zero gradient almost everywhere, so ``RoundSTE`` uses the
straight-through estimator: the backward pass treats it as the identity, and the encoder
learns through it.  The model never sees a label.

After training, every digit has a short binary code.  Similar digits should get similar
codes, so the nearest codes by Hamming distance (the number of differing bits) should mostly
belong to the same digit class.  The script measures this as precision@10 (test digits as
queries, training digits as the database) and compares it with random codes of the same
length (chance level) and with the unrounded sigmoid features (Euclidean distance).

Trains 16-bit and 32-bit codes on scikit-learn's bundled digits, on the GPU when PyTorch and
pyroundlib both have CUDA, else on the CPU.  Under a minute on a 2-core CPU.  From the
repository root, after ``make`` (any folder works as long as ``pyroundlib`` is importable):

    PYTHONPATH=. python3 examples/binary_codes.py [--epochs 150] [--out examples/output]

Writes ``binary_codes.png`` (test digits and their reconstructions) and ``binary_codes.json``
(the results) to ``--out``.
"""
from __future__ import annotations

import argparse
import json
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
CODE_LENGTHS = (16, 32)
TOP_K = 10
BATCH_SIZE = 64
LEARNING_RATE = 1e-3
HIDDEN = 256
PIXELS = 64  # 8x8 images


class BinaryAutoencoder(nn.Module):
    """Encoder -> sigmoid -> RoundSTE (the binary code) -> decoder."""

    def __init__(self, bits: int, hidden: int = HIDDEN):
        super().__init__()
        self.bits = bits
        self.encoder = nn.Sequential(nn.Linear(PIXELS, hidden), nn.ReLU(), nn.Linear(hidden, bits), nn.Sigmoid())
        self.binarise = pyroundlib.RoundSTE()
        self.decoder = nn.Sequential(nn.Linear(bits, hidden), nn.ReLU(), nn.Linear(hidden, PIXELS), nn.Sigmoid())

    def features(self, x: Tensor) -> Tensor:
        """The unrounded sigmoid features, each in (0, 1)."""
        return self.encoder(x)

    def encode(self, x: Tensor) -> Tensor:
        """The binary code: 0./1. values, with a straight-through gradient."""
        return self.binarise(self.features(x))

    def forward(self, x: Tensor) -> Tensor:
        return self.decoder(self.encode(x))


def pick_device() -> torch.device:
    """CUDA only when both PyTorch and the native library have it."""
    use_cuda = torch.cuda.is_available() and pyroundlib.library_info()["cuda"]
    return torch.device("cuda" if use_cuda else "cpu")


def load_data(device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Digits scaled to [0, 1], as (x_train, y_train, x_test, y_test); a fixed, stratified 75/25 split."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.25, random_state=SEED, stratify=digits.target)
    return tuple(torch.as_tensor(a, device=device) for a in (x_train, y_train, x_test, y_test))


def train(model: nn.Module, x_train: Tensor, epochs: int, desc: str) -> None:
    """Minimise the reconstruction MSE with Adam, in shuffled mini-batches."""
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    generator = torch.Generator().manual_seed(SEED)
    model.train()
    progress = tqdm(range(epochs), desc=desc, unit="epoch")
    for _ in progress:
        order = torch.randperm(len(x_train), generator=generator).to(x_train.device)
        total = torch.zeros((), device=x_train.device)
        for batch in x_train[order].split(BATCH_SIZE):
            loss = nn.functional.mse_loss(model(batch), batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.detach() * len(batch)
        progress.set_postfix(mse=f"{total.item() / len(x_train):.4f}")


def precision_at_k(queries: Tensor, query_labels: Tensor, database: Tensor, database_labels: Tensor,
                   k: int, p: float) -> float:
    """Mean fraction of each query's k nearest database items (Minkowski p-distance) with the query's label.

    For 0/1 codes, p=1 is the Hamming distance.  Ties are broken by database order (a stable sort).
    """
    distances = torch.cdist(queries.double(), database.double(), p=p)
    nearest = distances.argsort(dim=1, stable=True)[:, :k]
    return (database_labels[nearest] == query_labels[:, None]).double().mean().item()


def random_codes(n: int, bits: int, generator: torch.Generator, device: torch.device) -> Tensor:
    """Chance level: n codes of independent, uniformly random bits."""
    return torch.randint(0, 2, (n, bits), generator=generator).to(device)


@torch.no_grad()
def evaluate(model: BinaryAutoencoder, data: tuple[Tensor, Tensor, Tensor, Tensor]) -> dict[str, float]:
    """Test MSE, and precision@k of binary codes, sigmoid features and random codes."""
    x_train, y_train, x_test, y_test = data
    model.eval()
    generator = torch.Generator().manual_seed(SEED)
    random_test, random_train = (random_codes(len(x), model.bits, generator, x.device) for x in (x_test, x_train))
    return {
        "test_mse": nn.functional.mse_loss(model(x_test), x_test).item(),
        "precision_binary_hamming": precision_at_k(model.encode(x_test), y_test, model.encode(x_train), y_train,
                                                   TOP_K, p=1),
        "precision_sigmoid_euclidean": precision_at_k(model.features(x_test), y_test, model.features(x_train),
                                                      y_train, TOP_K, p=2),
        "precision_random_hamming": precision_at_k(random_test, y_test, random_train, y_train, TOP_K, p=1),
    }


def reference_results(data: tuple[Tensor, Tensor, Tensor, Tensor]) -> dict[str, float]:
    """Yardsticks without a model: the mean training image as reconstruction, raw pixels for retrieval."""
    x_train, y_train, x_test, y_test = data
    return {
        "mean_image_test_mse": nn.functional.mse_loss(x_train.mean(0).expand_as(x_test), x_test).item(),
        "precision_raw_pixels_euclidean": precision_at_k(x_test, y_test, x_train, y_train, TOP_K, p=2),
    }


@torch.no_grad()
def save_reconstructions(models: dict[int, BinaryAutoencoder], x_test: Tensor, y_test: Tensor, path: Path) -> None:
    """One test digit of each class (columns): the original, then each model's reconstruction (rows)."""
    columns = [int((y_test == label).nonzero()[0]) for label in range(10)]
    rows = {"original": x_test[columns]}
    for bits, model in models.items():
        rows[f"{bits}-bit code"] = model(x_test[columns])
    fig = Figure(figsize=(len(columns) * 0.9, len(rows) * 1.0 + 0.4), layout="constrained")
    axes = fig.subplots(len(rows), len(columns))
    for axes_row, (name, images) in zip(axes, rows.items()):
        axes_row[0].set_ylabel(name, fontsize=8)
        for ax, image in zip(axes_row, images.cpu().numpy()):
            ax.imshow(image.reshape(8, 8), cmap="gray_r", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle("Test digits reconstructed from binary codes (sigmoid -> pyroundlib.RoundSTE)", fontsize=9)
    fig.savefig(path, dpi=150)


def summary(results: dict) -> str:
    lines = [f"Binary codes on sklearn digits ({results['train_size']} train = database, "
             f"{results['test_size']} test = queries), {results['epochs']} epochs on {results['device']}",
             f"{'bits':>4}  {'test MSE':>8}  {f'P@{TOP_K} binary':>12}  {f'P@{TOP_K} sigmoid':>13}  "
             f"{f'P@{TOP_K} random':>12}"]
    for bits, r in results["codes"].items():
        lines.append(f"{bits:>4}  {r['test_mse']:>8.4f}  {r['precision_binary_hamming']:>12.3f}  "
                     f"{r['precision_sigmoid_euclidean']:>13.3f}  {r['precision_random_hamming']:>12.3f}")
    ref = results["reference"]
    lines += ["binary/random: Hamming distance on the codes; sigmoid: Euclidean distance on the unrounded features",
              f"reference: mean-image test MSE {ref['mean_image_test_mse']:.4f}; "
              f"raw 64 pixels (Euclidean) P@{TOP_K} {ref['precision_raw_pixels_euclidean']:.3f}",
              f"total time {results['seconds']:.1f} s"]
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=150, help="training epochs per code length (default: 150)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="folder for the PNG and JSON (default: examples/output, next to this script)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    start = time.perf_counter()
    device = pick_device()
    data = load_data(device)
    x_train, _, x_test, y_test = data

    models, codes = {}, {}
    for bits in CODE_LENGTHS:
        torch.manual_seed(SEED)
        models[bits] = BinaryAutoencoder(bits).to(device)
        train(models[bits], x_train, args.epochs, desc=f"{bits}-bit codes")
        codes[bits] = evaluate(models[bits], data)

    args.out.mkdir(parents=True, exist_ok=True)
    save_reconstructions(models, x_test, y_test, args.out / "binary_codes.png")
    results = {"device": str(device), "epochs": args.epochs, "seed": SEED, "top_k": TOP_K,
               "train_size": len(x_train), "test_size": len(x_test), "codes": codes,
               "reference": reference_results(data), "seconds": time.perf_counter() - start}
    (args.out / "binary_codes.json").write_text(json.dumps(results, indent=2) + "\n")
    print(summary(results))
    print(f"wrote {args.out / 'binary_codes.png'} and {args.out / 'binary_codes.json'}")


if __name__ == "__main__":
    main()
