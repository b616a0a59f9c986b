"""A/B on the CPU: lltm_sequence, float32, fwd+bwd and inference, with nn.LSTM timed beside it
in every worker, for two builds of the library (``ab.py``'s ``NAME=TREE@LIBRARY``): a batch of 8
rows or more split in parts of a single row whatever the size of W_h, against, where W_h is over
512 KB, parts of 4 rows or more, or the grid where those are fewer than the threads.

    python3 ab_narrow.py main ROUNDS old=$PWD@OLD_LIBRARY new=$PWD@NEW_LIBRARY
"""
import math
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import ab  # noqa: E402

SIZES = [(100, 12, 64, 256), (30, 16, 256, 256), (30, 8, 256, 256), (100, 16, 128, 256), (100, 12, 256, 512),
         (100, 32, 64, 256), (30, 32, 256, 256), (50, 24, 128, 256), (16, 64, 16, 256), (100, 8, 128, 128),
         (100, 64, 256, 256), (50, 64, 64, 128), (8, 32, 8, 64), (30, 4, 256, 256)]


def timed(f, budget=0.04):
    """Microseconds a call: as many calls as fill `budget` seconds (3 at least), after two."""
    f(); f()
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < budget:
        f(); n += 1
    reps = max(3, n)
    start = time.perf_counter()
    for _ in range(reps):
        f()
    return (time.perf_counter() - start) / reps * 1e3


def worker():
    import torch
    import pyroundlib
    torch.manual_seed(0)
    cases = {}
    for T, B, I, S in SIZES:
        x = torch.randn(T, B, I, requires_grad=True)
        w = (torch.randn(3 * S, S + I) / math.sqrt(S)).requires_grad_()
        b = (torch.randn(3 * S) * .1).requires_grad_()
        h0, c0, g = torch.randn(B, S), torch.randn(B, S), torch.randn(T, B, S)
        lstm = torch.nn.LSTM(I, S)
        params = [x, *lstm.parameters()]

        def ours_train(x=x, w=w, b=b, h0=h0, c0=c0, g=g):
            out, _ = pyroundlib.lltm_sequence(x, w, b, (h0, c0))
            torch.autograd.grad(out, [x, w, b], g)

        def ours_infer(x=x, w=w, b=b, h0=h0, c0=c0):
            with torch.inference_mode():
                pyroundlib.lltm_sequence(x, w, b, (h0, c0))

        def lstm_train(x=x, h0=h0, c0=c0, g=g, lstm=lstm, params=params):
            out, _ = lstm(x, (h0[None], c0[None]))
            torch.autograd.grad(out, params, g)

        def lstm_infer(x=x, h0=h0, c0=c0, lstm=lstm):
            with torch.inference_mode():
                lstm(x, (h0[None], c0[None]))
        tag = f"({T},{B},{I},{S})"
        cases.update({f"{tag} fwd+bwd ours": ours_train, f"{tag} fwd+bwd nn.LSTM": lstm_train,
                      f"{tag} inference ours": ours_infer, f"{tag} inference nn.LSTM": lstm_infer})
    times = {k: [] for k in cases}
    for _ in range(3):
        names = list(cases)
        random.shuffle(names)
        for k in names:
            times[k].append(timed(cases[k]))
    print("JSON" + __import__("json").dumps({k: statistics.median(v) for k, v in times.items()}), flush=True)


if __name__ == "__main__":
    ab.cli(__file__, worker)
