"""The library's forward loop alone (one ctypes call, fresh gates each call), float32 inference, per step,
at 1 and 16 threads: is a core's product rate the code's or the machine's shared parts?"""
import statistics, time
import torch, pyroundlib
from pyroundlib import sequence as seq
from pyroundlib._common import DTYPE_CODES
def timed(fn, calls):
    fn(); t0 = time.perf_counter()
    for _ in range(calls): fn()
    return (time.perf_counter() - t0) / calls * 1e6
I = 16
for (T, B, S, threads) in [(100, 4, 256, 1), (100, 6, 256, 1), (100, 64, 256, 16), (100, 64, 256, 1), (100, 96, 256, 16), (100, 64, 128, 16), (100, 4, 128, 1)]:
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, B, I, generator=g); w = torch.randn(3 * S, S + I, generator=g) * S ** -0.5
    b = torch.randn(3 * S, generator=g); h0, c0 = torch.randn(B, S, generator=g), torch.randn(B, S, generator=g)
    gates0 = seq.input_half(x, w, b, S)
    gates = gates0.clone()
    output, cells, c_n = x.new_empty(T, B, S), x.new_empty(T, B, S), torch.empty_like(c0)
    def loop():
        gates.copy_(gates0)
        seq._sequence_forward_kernel(x, gates.data_ptr(), w.data_ptr(), S + I, h0.data_ptr(), c0.data_ptr(),
                                     output.data_ptr(), cells.data_ptr(), c_n.data_ptr(), T, B, S, DTYPE_CODES[x.dtype])
    def copy():
        gates.copy_(gates0)
    t = statistics.median(timed(loop, 5) for _ in range(5)) - statistics.median(timed(copy, 20) for _ in range(5))
    macs = T * B * S * 3 * S
    print(f"(T,B,S)=({T},{B},{S}) {threads} threads: loop {t:.0f} us, {t / T:.1f} us a step, {macs / t / 1e3:.1f} G multiply-adds/s, "
          f"{macs / t / 1e3 / threads:.1f} a thread", flush=True)
