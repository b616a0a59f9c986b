import time, torch, torch.nn.functional as F
from pyroundlib import sequence as sq
from pyroundlib.sequence import lltm_sequence
from pyroundlib._common import DTYPE_CODES
def med(f, n=40):
    for _ in range(5): f()
    ts=[]
    for _ in range(n):
        t0=time.perf_counter(); f(); ts.append(time.perf_counter()-t0)
    ts.sort(); return ts[n//2]*1e6
torch.manual_seed(0)
print("threads", torch.get_num_threads())
for T,B,I,S in [(16,64,16,256),(30,16,256,256),(100,12,64,256),(100,64,256,256),(30,4,256,256)]:
    x=torch.randn(T,B,I); w=torch.randn(3*S,S+I)/(S+I)**0.5; b=torch.zeros(3*S)
    lstm=torch.nn.LSTM(I,S)
    def call():
        with torch.inference_mode(): lltm_sequence(x,w,b)
    def peer():
        with torch.inference_mode(): lstm(x)
    gates=x.new_empty(T,B,3*S)
    def lin():
        with torch.inference_mode(): F.linear(x,w[:,S:],b)
    def lib():
        sq._input_half_kernel(x, x.data_ptr(), w.data_ptr(), b.data_ptr(), gates.data_ptr(), T*B, I, S, DTYPE_CODES[x.dtype])
    def alloc():
        x.new_empty(T,B,3*S); x.new_empty(T,B,S); x.new_empty(T,B,S); x.new_empty(B,S)
    r={k:med(f) for k,f in (("call",call),("nn.LSTM",peer),("F.linear",lin),("library input half",lib),("allocs",alloc))}
    print((T,B,I,S), "  ".join(f"{k} {v:.1f}us" for k,v in r.items()), flush=True)
