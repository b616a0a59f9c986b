# whole lltm_sequence calls under PRL_AB_PACK = 0 (W_h packed once, shared by the row parts) and
# 2 (each row part packs its own copy): fwd+bwd and inference, interleaved rounds, medians
import os, sys, time, torch, statistics as st, pyroundlib
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
print(torch.__version__, torch.get_num_threads(), flush=True)
torch.manual_seed(0)
SIZES = [(8,32,8,64),(50,64,64,128),(30,4,256,256),(100,1,8,8),(100,64,256,256),(8,1,256,256),(100,1,256,256),
         (20,16,32,32),(64,8,128,64),(16,64,16,256),(100,32,64,128),(30,16,256,256),(100,12,64,256)]
def tm(f, n):
    ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return st.median(ts)
for T,B,I,S in SIZES:
    x=torch.randn(T,B,I); W=(torch.randn(3*S,S+I)*0.05).requires_grad_(); b=(torch.randn(3*S)*0.1).requires_grad_()
    h0=(torch.randn(B,S)*0.1).requires_grad_(); c0=(torch.randn(B,S)*0.1).requires_grad_(); xr=x.clone().requires_grad_()
    lstm=torch.nn.LSTM(I,S)
    def train():
        o,(h,c)=pyroundlib.lltm_sequence(xr,W,b,(h0,c0)); (o.sum()+c.sum()).backward()
    def infer():
        with torch.inference_mode(): pyroundlib.lltm_sequence(x,W,b,(h0,c0))
    def ptrain():
        o,(h,c)=lstm(xr); o.sum().backward()
    def pinfer():
        with torch.inference_mode(): lstm(x)
    got = {}
    for m in "02":
        os.environ["PRL_AB_PACK"] = m
        o,(h,c)=pyroundlib.lltm_sequence(xr,W,b,(h0,c0)); g=torch.autograd.grad(o.sum()*1.3+c.sum(), (xr,W,b,h0,c0))
        got[m] = (o,h,c)+g
    same = all(torch.equal(a, b2) for a, b2 in zip(got["0"], got["2"]))
    reps = max(3, min(25, int(0.05 / max(1e-5, tm(train, 3)))))
    res = {k: [] for k in ("t0","t2","i0","i2","pt","pi")}
    for r in range(rounds):
        for m in ("02" if r % 2 == 0 else "20"):
            os.environ["PRL_AB_PACK"] = m
            train(); infer()
            res["t"+m].append(tm(train, reps)); res["i"+m].append(tm(infer, reps))
        ptrain(); pinfer()
        res["pt"].append(tm(ptrain, reps)); res["pi"].append(tm(pinfer, reps))
    os.environ["PRL_AB_PACK"] = "0"
    md = {k: st.median(v) for k, v in res.items()}
    rt = st.median([a / b2 for a, b2 in zip(res["t2"], res["t0"])]); ri = st.median([a / b2 for a, b2 in zip(res["i2"], res["i0"])])
    print(f"{(T,B,I,S)} same {same} | fwd+bwd 2/0 {rt:.3f} ours/LSTM {md['t0']/md['pt']:.3f} -> {md['t2']/md['pt']:.3f}"
          f" | inference 2/0 {ri:.3f} ours/LSTM {md['i0']/md['pi']:.3f} -> {md['i2']/md['pi']:.3f}", flush=True)
