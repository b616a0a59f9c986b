# AB-MEASURE: two library builds in alternating fresh processes; each process times lltm_sequence
# (best of 5 after a warm-up) and nn.LSTM at each size; ratio new / old per round, medians.
import json, os, random, statistics, subprocess, sys, time
SIZES = [(100,1,256,256),(30,4,256,256),(50,4,128,128),(64,1,64,256),(32,2,64,256),(16,4,64,128),(50,1,256,256),
         (8,1,256,256),(16,3,16,256),(100,2,64,512),(16,64,16,256),(8,32,8,64),(50,2,64,256,"f64")]
def worker():
    import torch
    from pyroundlib.sequence import lltm_sequence
    torch.manual_seed(0)
    out = {}
    for size in SIZES:
        T,B,I,S = size[:4]; dt = torch.float64 if len(size) > 4 else torch.float32
        x = torch.randn(T,B,I,dtype=dt); w = (torch.randn(3*S,S+I,dtype=dt)/(S+I)**0.5).requires_grad_(); b = torch.zeros(3*S,dtype=dt,requires_grad=True)
        lstm = torch.nn.LSTM(I,S).to(dt)
        def ours(mode):
            if mode == "inf":
                with torch.inference_mode(): lltm_sequence(x,w,b)
            else:
                o,_ = lltm_sequence(x.requires_grad_(),w,b); o.sum().backward()
        def theirs(mode):
            if mode == "inf":
                with torch.inference_mode(): lstm(x)
            else:
                o,_ = lstm(x.requires_grad_()); o.sum().backward()
        for mode in ("inf","fb"):
            for name, f in (("ours",ours),("lstm",theirs)):
                f(mode); ts=[]
                for _ in range(5):
                    t0=time.perf_counter(); f(mode); ts.append(time.perf_counter()-t0)
                out[f"{size}|{mode}|{name}"] = min(ts)
    print(json.dumps(out))
if sys.argv[1] == "worker":
    worker(); sys.exit()
rounds = int(sys.argv[1]); libs = {"old": sys.argv[2], "new": sys.argv[3]}
res = {"old": [], "new": []}
for r in range(rounds):
    order = list(libs); random.shuffle(order)
    for v in order:
        env = dict(os.environ, PYROUNDLIB_LIBRARY=libs[v])
        p = subprocess.run([sys.executable, __file__, "worker"], env=env, capture_output=True, text=True)
        if p.returncode: print(p.stderr[-3000:]); sys.exit(1)
        res[v].append(json.loads(p.stdout.strip().splitlines()[-1]))
print("threads", os.environ.get("OMP_NUM_THREADS", "default"), "rounds", rounds)
for size in SIZES:
    for mode in ("inf","fb"):
        k = f"{size}|{mode}"
        new_old = statistics.median(n[k+"|ours"]/o[k+"|ours"] for n,o in zip(res["new"],res["old"]))
        old_l = statistics.median(o[k+"|ours"]/o[k+"|lstm"] for o in res["old"])
        new_l = statistics.median(n[k+"|ours"]/n[k+"|lstm"] for n in res["new"])
        print(f"{str(size):26s} {mode:3s} new/old {new_old:.3f}  old/lstm {old_l:.3f}  new/lstm {new_l:.3f}  old {statistics.median(o[k+'|ours'] for o in res['old'])*1e6:8.1f}us", flush=True)
