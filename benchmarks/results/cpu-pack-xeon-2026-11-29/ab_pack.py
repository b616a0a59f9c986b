# AB-MEASURE: the grid split (PRL_AB_PACK=column groups) against the row split, interleaved rounds in one process
import os, sys, time, random, statistics, torch
from pyroundlib.sequence import lltm_sequence
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
variants = sys.argv[2].split(",") if len(sys.argv) > 2 else ["", "2", "4", "8"]
sizes = [(16,64,16,256),(100,64,256,256),(30,16,256,256),(30,8,256,256),(100,12,64,256),(50,64,64,128),(100,32,64,128),(30,32,256,256),(64,8,128,64),(8,32,8,64)]
if len(sys.argv) > 3: sizes = [tuple(map(int, s.split("x"))) for s in sys.argv[3].split(",")]
torch.manual_seed(0)
def make(T,B,I,S):
    x=torch.randn(T,B,I); w=(torch.randn(3*S,S+I)/(S+I)**0.5).requires_grad_(); b=torch.zeros(3*S,requires_grad=True)
    lstm=torch.nn.LSTM(I,S)
    return x,w,b,lstm
def t_ours(x,w,b,mode):
    t0=time.perf_counter()
    if mode=="inf":
        with torch.inference_mode(): lltm_sequence(x,w,b)
    else:
        o,(h,c)=lltm_sequence(x.requires_grad_(),w,b); o.sum().backward()
    return time.perf_counter()-t0
def t_lstm(x,lstm,mode):
    t0=time.perf_counter()
    if mode=="inf":
        with torch.inference_mode(): lstm(x)
    else:
        o,_=lstm(x.requires_grad_()); o.sum().backward()
    return time.perf_counter()-t0
data={s:make(*s) for s in sizes}
res={}
print("threads",torch.get_num_threads(), flush=True)
for r in range(rounds):
    for s in sizes:
        x,w,b,lstm=data[s]
        for mode in ("inf","fb"):
            order=variants+["lstm"]; random.shuffle(order)
            for v in order:
                reps=[]
                for _ in range(3):
                    if v=="lstm": reps.append(t_lstm(x.detach(),lstm,mode))
                    else:
                        if v: os.environ["PRL_AB_PACK"]=v
                        else: os.environ.pop("PRL_AB_PACK",None)
                        reps.append(t_ours(x.detach(),w,b,mode))
                res.setdefault((s,mode,v),[]).append(min(reps))
for s in sizes:
    for mode in ("inf","fb"):
        base=res[(s,mode,"")]
        line=f"{str(s):22s} {mode:3s} row {statistics.median(base)*1e6:9.1f}us /lstm {statistics.median([a/b for a,b in zip(base,res[(s,mode,'lstm')])]):.3f}"
        for v in variants[1:]:
            rr=[a/b for a,b in zip(res[(s,mode,v)],base)]
            line+=f" | cg{v} {statistics.median(rr):.3f} (/lstm {statistics.median([a/b for a,b in zip(res[(s,mode,v)],res[(s,mode,'lstm')])]):.3f})"
        print(line, flush=True)
