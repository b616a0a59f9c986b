"""Inference call's parts on the CPU: input half, the library loop, the whole call, nn.LSTM."""
import statistics, sys, time, torch, pyroundlib
from pyroundlib import sequence as sq
from pyroundlib._common import DTYPE_CODES
def per(f, n=20):
    f(); t = time.perf_counter_ns()
    for _ in range(n): f()
    return (time.perf_counter_ns() - t) / n / 1e3
for T, B, I, S in [(50, 64, 64, 128), (16, 64, 16, 256), (100, 64, 256, 256), (30, 16, 256, 256)]:
    x = torch.randn(T, B, I); w = torch.randn(3 * S, S + I) / S ** 0.5; b = torch.randn(3 * S) * .1
    h0, c0 = torch.randn(B, S), torch.randn(B, S)
    lstm = torch.nn.LSTM(I, S)
    gates = sq.input_half(x, w, b, S)
    out, cells, cn = torch.empty(T, B, S), torch.empty(T, B, S), torch.empty(B, S)
    g2 = gates.clone()
    def loop():
        g2.copy_(gates)
        sq._sequence_forward_kernel(x, g2.data_ptr(), w.data_ptr(), S + I, h0.data_ptr(), c0.data_ptr(), out.data_ptr(),
                                    cells.data_ptr(), cn.data_ptr(), T, B, S, DTYPE_CODES[x.dtype])
    cases = {"input half": lambda: sq.input_half(x, w, b, S), "copy of gates": lambda: g2.copy_(gates),
             "copy + loop": loop, "whole": lambda: pyroundlib.lltm_sequence(x, w, b, (h0, c0)),
             "nn.LSTM": lambda: lstm(x, (h0[None], c0[None]))}
    res = {k: [] for k in cases}
    with torch.inference_mode():
        for r in range(7):
            for k, f in cases.items():
                res[k].append(per(f))
    m = {k: statistics.median(v) for k, v in res.items()}
    fl = 2 * T * B * (I + S) * 3 * S / 1e3  # GFLOP * 1e6: / us gives GFLOP/s
    print(f"({T},{B},{I},{S}): " + "; ".join(f"{k} {v:.0f} us" for k, v in m.items()) +
          f"; loop alone {m['copy + loop'] - m['copy of gates']:.0f} us; whole/LSTM {m['whole'] / m['nn.LSTM']:.3f}; "
          f"ours {fl / m['whole']:.0f} GFLOP/s, nn.LSTM {fl * 4 / 3 / m['nn.LSTM']:.0f} GFLOP/s (its own FLOPs); "
          f"input half {2 * T * B * I * 3 * S / 1e3 / m['input half']:.0f}, loop {2 * T * B * S * 3 * S / 1e3 / (m['copy + loop'] - m['copy of gates']):.0f} GFLOP/s", flush=True)
