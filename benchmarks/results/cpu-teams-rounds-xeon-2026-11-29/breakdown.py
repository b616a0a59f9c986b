"""Where a CPU lltm_sequence inference call's time goes: the whole call, the input half (torch's GEMM), the
library's loop alone (ctypes, the gates precomputed), at 16 and 8 torch threads; medians of interleaved rounds."""
import statistics, time
import torch, pyroundlib
from pyroundlib import sequence as seq
from pyroundlib._common import DTYPE_CODES
def timed(fn, calls):
    fn(); t0 = time.perf_counter()
    for _ in range(calls): fn()
    return (time.perf_counter() - t0) / calls * 1e6
for (T, B, I, S) in [(16, 64, 16, 256), (100, 64, 256, 256), (30, 4, 256, 256), (100, 1, 256, 256), (50, 64, 64, 128)]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, B, I, generator=g); w = torch.randn(3 * S, S + I, generator=g) * S ** -0.5
    b = torch.randn(3 * S, generator=g); h0, c0 = torch.randn(B, S, generator=g), torch.randn(B, S, generator=g)
    m = torch.nn.LSTM(I, S)
    gates = seq.input_half(x, w, b, S)
    output, cells, c_n = x.new_empty(T, B, S), x.new_empty(T, B, S), torch.empty_like(c0)
    def whole():
        with torch.inference_mode():
            pyroundlib.lltm_sequence(x, w, b, (h0, c0))
    def lstm():
        with torch.inference_mode():
            m(x)
    def half():
        seq.input_half(x, w, b, S)
    def loop():
        seq._sequence_forward_kernel(x, gates.data_ptr(), w.data_ptr(), S + I, h0.data_ptr(), c0.data_ptr(),
                                     output.data_ptr(), cells.data_ptr(), c_n.data_ptr(), T, B, S, DTYPE_CODES[x.dtype])
    calls = 10 if T * B * S < 2 ** 20 else 3
    for threads in (16, 8):
        torch.set_num_threads(threads)
        times = {k: [] for k in ("whole", "nn.LSTM@16", "input half", "loop")}
        for _ in range(7):
            for k, f in (("whole", whole), ("nn.LSTM@16", lstm), ("input half", half), ("loop", loop)):
                if k == "nn.LSTM@16": torch.set_num_threads(16)
                times[k].append(timed(f, calls))
                torch.set_num_threads(threads)
        print(f"{(T, B, I, S)} {threads} threads: " + ", ".join(f"{k} {statistics.median(v):.0f} us" for k, v in times.items()), flush=True)
    torch.set_num_threads(16)
