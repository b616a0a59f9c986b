# ours / nn.LSTM at ten sizes, fwd+bwd ("train") and inference: interleaved rounds, the median ratio (a JSON line)
import sys, time, torch, statistics as st, json, os
import pyroundlib
SIZES=[(8,32,8,64),(50,64,64,128),(30,4,256,256),(100,64,256,256),(16,64,16,256),(100,32,64,128),(30,16,256,256),(100,12,64,256),(64,8,128,64),(20,16,32,32)]
rounds=int(sys.argv[1]) if len(sys.argv)>1 else 7
torch.manual_seed(0)
out={}
for T,B,I,S in SIZES:
    x=torch.randn(T,B,I); W=(torch.randn(3*S,S+I)*0.05).requires_grad_(); b=(torch.randn(3*S)*0.1).requires_grad_()
    h0=torch.zeros(B,S); c0=torch.zeros(B,S); xr=x.clone().requires_grad_()
    lstm=torch.nn.LSTM(I,S)
    def ours_t():
        o,(h,c)=pyroundlib.lltm_sequence(xr,W,b,(h0,c0)); o.sum().backward()
    def peer_t():
        o,(h,c)=lstm(xr); o.sum().backward()
    def ours_i():
        with torch.inference_mode(): pyroundlib.lltm_sequence(x,W,b,(h0,c0))
    def peer_i():
        with torch.inference_mode(): lstm(x)
    for mode,(f,g) in {"train":(ours_t,peer_t),"infer":(ours_i,peer_i)}.items():
        f();g();f();g()
        n=max(3,int(0.02/max(1e-5,(lambda t0:(f(),time.perf_counter()-t0)[1])(time.perf_counter()))))
        ratios=[]
        for r in range(rounds):
            a=[];p=[]
            for _ in range(n):
                t=time.perf_counter(); f(); a.append(time.perf_counter()-t)
                t=time.perf_counter(); g(); p.append(time.perf_counter()-t)
            ratios.append(st.median(a)/st.median(p))
        out[f"{(T,B,I,S)} {mode}"]=st.median(ratios)
print(json.dumps(out))
