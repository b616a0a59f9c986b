"""The LLTM pointwise kernels as a sequence's loops run them: launched back to back inside a
CUDA graph, each on its own step's slices, timed with CUDA events (us a launch, median of
the replays).  Back-to-back plain launches would time the launch rate instead
(benchmarks/NOTES.md).  To compare two builds, run this once with each:

    PYROUNDLIB_LIBRARY=build/libpyroundlib.so python3 benchmarks/pointwise_graphs.py
"""
import argparse
import statistics

import torch

from pyroundlib import lltm
from pyroundlib._common import DTYPE_CODES

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SIZES = [(64, 512), (256, 1024)]  # (B, S) of the middle and large sequence cases


def graph_time(launch, launches: int, replays: int) -> float:
    """us per call of launch(k), k = 0 .. launches - 1 captured in one CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture
        launch(0)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for k in range(launches):
            launch(k)
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / launches)
    return statistics.median(times)


def time_pointwise(dtype: torch.dtype, batch: int, state: int, launches: int, replays: int):
    """(forward, backward) us a launch at [batch, state], each launch on its own step."""
    kw = dict(device="cuda", dtype=dtype)
    gates = torch.randn(launches, batch, 3 * state, **kw)
    cells, grad_h = torch.randn(launches + 1, batch, state, **kw), torch.randn(launches + 1, batch, state, **kw)
    hs, d_gates = torch.empty(launches + 1, batch, state, **kw), torch.empty_like(gates)
    code = DTYPE_CODES[dtype]
    forward = graph_time(lambda k: lltm._forward_kernel(
        gates, gates[k].data_ptr(), cells[k].data_ptr(), hs[k + 1].data_ptr(), cells[k + 1].data_ptr(), batch,
        state, code), launches, replays)
    backward = graph_time(lambda k: lltm._backward_kernel(
        gates, grad_h[k + 1].data_ptr(), hs[k + 1].data_ptr(), gates[k].data_ptr(), cells[k].data_ptr(),
        d_gates[k].data_ptr(), hs[k].data_ptr(), None, batch, state, code), launches, replays)
    return forward, backward


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launches", type=int, default=100, help="launches a graph replay (default 100)")
    parser.add_argument("--replays", type=int, default=15, help="replays timed (default 15)")
    parser.add_argument("--sizes", default=",".join(f"{b}x{s}" for b, s in SIZES), help="BxS,... (default %(default)s)")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="default %(default)s")
    args = parser.parse_args(argv)
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}: LLTM pointwise kernels in a CUDA graph, "
             f"us a launch (median of {args.replays} replays of {args.launches} launches)"]
    for name in args.dtypes.split(","):
        for size in args.sizes.split(","):
            batch, state = (int(n) for n in size.split("x"))
            forward, backward = time_pointwise(DTYPES[name], batch, state, args.launches, args.replays)
            lines.append(f"{name:9s} (B, S) = ({batch}, {state}): forward {forward:.2f}, backward {backward:.2f}")
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    main()
