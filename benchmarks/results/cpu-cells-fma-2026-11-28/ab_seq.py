# usage: ab.py  -> prints median ratio ours/nn.LSTM per case (fwd+bwd and inference)
import torch, time, statistics, sys, os, random
import pyroundlib
torch.manual_seed(0)
sizes = [(8,32,8,64),(50,64,64,128),(30,4,256,256),(100,1,8,8),(100,64,256,256),(8,1,256,256),(100,1,256,256),(20,16,32,32),(64,8,128,64),(16,64,16,256),(100,32,64,128)]
if len(sys.argv) > 1: sizes = [tuple(map(int, s.split(','))) for s in sys.argv[1:]]
rounds = int(os.environ.get("ROUNDS", 7))
def t(f):
    t0 = time.perf_counter(); f(); return time.perf_counter() - t0
for (T,B,I,S) in sizes:
    ours = pyroundlib.LLTMLayer(I,S); lstm = torch.nn.LSTM(I,S)
    x = torch.randn(T,B,I, requires_grad=True)
    def fb(m):
        def f():
            out,_ = m(x); out.sum().backward()
        return f
    def inf(m):
        def f():
            with torch.inference_mode(): m(x)
        return f
    for mode, mk in (("fwd+bwd", fb), ("inference", inf)):
        a, b = mk(ours), mk(lstm)
        n = max(1, int(0.05 / max(t(a), 1e-6)))
        for _ in range(2): a(); b()
        rs = []; ta = []
        for r in range(rounds):
            order = [0,1]; random.shuffle(order)
            tt = {}
            for o in order:
                f = (a, b)[o]
                tt[o] = min(t(f) for _ in range(n)) if n > 1 else t(f)
            rs.append(tt[0]/tt[1]); ta.append(tt[0])
        print(f"{(T,B,I,S)} {mode}: ours {statistics.median(ta)*1e3:.3f} ms ratio {statistics.median(rs):.3f}", flush=True)
