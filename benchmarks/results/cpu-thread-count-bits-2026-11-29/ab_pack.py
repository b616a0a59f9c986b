# forward loop alone and whole inference calls under PRL_AB_PACK = 0 (as built), 1 (W_h packed by the
# calling thread), 2 (each row part packs its own copy); interleaved rounds, medians
import os, sys, time, torch, statistics as st, pyroundlib
from pyroundlib import sequence as sq
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
print(torch.__version__, torch.get_num_threads(), flush=True)
torch.manual_seed(0)
SIZES = [(1,64,16,256), (16,64,16,256), (30,16,256,256), (100,12,64,256), (100,64,256,256), (50,64,64,128), (8,32,8,64), (30,4,256,256)]
def tm(f, n):
    ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return st.median(ts)
for T,B,I,S in SIZES:
    x=torch.randn(T,B,I); W=torch.randn(3*S,S+I)*0.05; b=torch.randn(3*S)*0.1
    h0=torch.randn(B,S)*0.1; c0=torch.randn(B,S)*0.1
    gates0=sq.input_half(x,W,b,S); gates=gates0.clone()
    out=torch.empty(T,B,S); cells=torch.empty(T,B,S); cn=torch.empty(B,S)
    lstm=torch.nn.LSTM(I,S)
    def loop():
        sq._sequence_forward_kernel(x, gates.data_ptr(), W.data_ptr(), S+I, h0.data_ptr(), c0.data_ptr(), out.data_ptr(), cells.data_ptr(), cn.data_ptr(), T,B,S, sq.DTYPE_CODES[x.dtype])
    def call():
        with torch.inference_mode(): pyroundlib.lltm_sequence(x,W,b,(h0,c0))
    def peer():
        with torch.inference_mode(): lstm(x)
    outs = {}
    for m in "012":
        os.environ["PRL_AB_PACK"] = m; gates.copy_(gates0); loop(); outs[m] = out.clone()
    same = all(torch.equal(outs["0"], outs[m]) for m in "12")
    res = {m: {"loop": [], "call": []} for m in "012"}; peers = []
    for r in range(rounds):
        for m in ("012" if r % 2 == 0 else "210"):
            os.environ["PRL_AB_PACK"] = m
            for _ in range(3): loop(); call()
            res[m]["loop"].append(tm(loop, 25)); res[m]["call"].append(tm(call, 25))
        peers.append(tm(peer, 25))
    os.environ["PRL_AB_PACK"] = "0"
    p = st.median(peers)
    line = f"{(T,B,I,S)} same bits {same} | nn.LSTM {p*1e6:.0f} us"
    for m in "012":
        l, c = st.median(res[m]["loop"]), st.median(res[m]["call"])
        line += f" | mode {m}: loop {l*1e6:.0f} call {c*1e6:.0f} ({c/p:.3f})"
    print(line, flush=True)
