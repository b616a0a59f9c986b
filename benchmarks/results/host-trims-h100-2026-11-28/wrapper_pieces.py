"""Host time of the Python pieces around the stack op/Function at (8,32,8,64) on CUDA (no kernels)."""
import statistics, time, itertools
import torch
import pyroundlib
from pyroundlib import layer as L, sequence, graphs
from pyroundlib._common import autocast_cast, has_tangent, check_tensor, no_gradient_wanted

dev = torch.device("cuda")
T, B, I, S = 8, 32, 8, 64
ours = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, device=dev)
x = torch.randn(T, B, I, device=dev)
params = [t for pair in ours._direction_parameters() for t in pair]
ws, bs = params[::2], params[1::2]
h0 = torch.zeros(4, B, S, device=dev)


def t(f, n=20000):
    for _ in range(2000):
        f()
    r = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        r.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(r)


rows = {
    "_all_fused (inference)": lambda: L._all_fused(x, T, B, I, S, 2, 2),
    "sequence._route": lambda: sequence._route(x, T, B, I, S, inference=True),
    "_tensor_core_products": lambda: sequence._tensor_core_products(x),
    "graphs.enabled": lambda: graphs.enabled(),
    "_fits": lambda: sequence._fits(sequence._fused_fits, "prl_lltm_sequence_fused_cuda_fits", x, B, I, S),
    "_direction_parameters": lambda: ours._direction_parameters(),
    "autocast_cast(9)": lambda: autocast_cast((x, *ws)),
    "is_autocast_enabled": lambda: torch.is_autocast_enabled("cuda"),
    "has_tangent(11)": lambda: has_tangent((x, h0, h0, *params)),
    "check_tensor": lambda: check_tensor("input", x),
    "no_gradient_wanted": lambda: no_gradient_wanted(itertools.chain((x,), ours.parameters())),
    "_Padded.takes (training)": lambda: L._Padded(2, False).takes(x, S, 2),
    "_replays_stack": lambda: L._replays_stack(L._STACK, x, h0, h0, params),
    "x.contiguous() x11": lambda: [p.contiguous() for p in (x, h0, h0, *params)],
    "x.new_empty x16": lambda: [x.new_empty(T, B, S) for _ in range(16)],
    "graphs.buffers enter/exit": lambda: graphs.buffers(x).__enter__() and None,
    "is_current_stream_capturing": lambda: torch.cuda.is_current_stream_capturing(),
    "x.is_cuda": lambda: x.is_cuda,
    "x.get_device()": lambda: x.get_device(),
}
with torch.inference_mode():
    for k, f in rows.items():
        if k == "graphs.buffers enter/exit":
            def f():
                with graphs.buffers(x):
                    pass
        print(f"{k:28s} {t(f, 5000 if 'x16' in k or 'x11' in k else 20000):7.2f} us")
