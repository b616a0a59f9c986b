import os, sys, torch, time
from pyroundlib.sequence import lltm_sequence
torch.manual_seed(0)
for T,B,I,S in [(1,64,16,256),(2,64,16,256),(16,64,16,256),(30,16,256,256),(16,64,16,128)]:
    x=torch.randn(T,B,I); w=torch.randn(3*S,S+I)/(S+I)**0.5; b=torch.zeros(3*S)
    os.environ.pop("PRL_AB_PHASES",None)
    for _ in range(20):
        with torch.inference_mode(): lltm_sequence(x,w,b)
    os.environ["PRL_AB_PHASES"]="1"
    for _ in range(5):
        with torch.inference_mode(): lltm_sequence(x,w,b)
    sys.stderr.flush()
    # back-to-back whole-call time
    os.environ.pop("PRL_AB_PHASES",None)
    ts=[]
    for _ in range(20):
        t0=time.perf_counter()
        with torch.inference_mode(): lltm_sequence(x,w,b)
        ts.append(time.perf_counter()-t0)
    ts.sort(); print(f"T{T} B{B} S{S}: call median {ts[10]*1e6:.1f} us", file=sys.stderr, flush=True)
