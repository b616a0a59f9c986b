# whole lltm_sequence calls with torch's BLAS where the library takes it by default (env unset: on
# Intel CPUs MKL for the input half, the gradient products and, at B <= 4, each step's product)
# against PYROUNDLIB_CPU_BLAS=0 (the library's own products everywhere); interleaved rounds, medians
import os, sys, time, torch, statistics as st, pyroundlib
from pyroundlib import _threads
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
print(torch.__version__, torch.get_num_threads(), "intel", _threads._intel_cpu(), flush=True)
torch.manual_seed(0)
SIZES = [(8,32,8,64),(50,64,64,128),(30,4,256,256),(100,1,8,8),(100,64,256,256),(8,1,256,256),(100,1,256,256),
         (20,16,32,32),(64,8,128,64),(16,64,16,256),(100,32,64,128),(30,16,256,256),(100,12,64,256)]
def mode(m):
    if m == "d": os.environ.pop(_threads.BLAS_ENV_VAR, None)
    else: os.environ[_threads.BLAS_ENV_VAR] = "0"
    _threads._given["gemm"] = None
def tm(f, n):
    ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return st.median(ts)
for T,B,I,S in SIZES:
    x=torch.randn(T,B,I); W=(torch.randn(3*S,S+I)*0.05).requires_grad_(); b=(torch.randn(3*S)*0.1).requires_grad_()
    h0=torch.zeros(B,S); c0=torch.zeros(B,S); xr=x.clone().requires_grad_()
    lstm=torch.nn.LSTM(I,S)
    def train():
        o,(h,c)=pyroundlib.lltm_sequence(xr,W,b,(h0,c0)); o.sum().backward()
    def infer():
        with torch.inference_mode(): pyroundlib.lltm_sequence(x,W,b,(h0,c0))
    def ptrain():
        o,(h,c)=lstm(xr); o.sum().backward()
    def pinfer():
        with torch.inference_mode(): lstm(x)
    mode("d"); train()
    reps = max(3, min(25, int(0.05 / max(1e-5, tm(train, 3)))))
    res = {k: [] for k in ("td","t0","id","i0","pt","pi")}
    for r in range(rounds):
        for m in ("d0" if r % 2 == 0 else "0d"):
            mode(m)
            train(); infer()
            res["t"+m].append(tm(train, reps)); res["i"+m].append(tm(infer, reps))
        ptrain(); pinfer()
        res["pt"].append(tm(ptrain, reps)); res["pi"].append(tm(pinfer, reps))
    mode("d")
    md = {k: st.median(v) for k, v in res.items()}
    rt = st.median([a / b2 for a, b2 in zip(res["t0"], res["td"])]); ri = st.median([a / b2 for a, b2 in zip(res["i0"], res["id"])])
    print(f"{(T,B,I,S)} | fwd+bwd =0/default {rt:.3f} ours/LSTM {md['td']/md['pt']:.3f} -> {md['t0']/md['pt']:.3f}"
          f" | inference =0/default {ri:.3f} ours/LSTM {md['id']/md['pi']:.3f} -> {md['i0']/md['pi']:.3f}", flush=True)
