"""In-process A/B of the CPU sequence loops of two library builds (ctypes, the C ABI), forward
and backward, on the given threads (the library's own workers): medians over interleaved rounds."""
import ctypes, sys, time, statistics, random, os
import torch
libs = [ctypes.CDLL(p) for p in sys.argv[1:3]]
threads = int(sys.argv[3]); rounds = int(sys.argv[4])
for l in libs:
    l.prl_set_cpu_threads(ctypes.c_int64(threads))
sizes = [(8,32,64),(50,64,128),(16,64,256),(30,16,256),(100,64,256),(100,32,128),(100,12,256),(30,4,256),(100,1,256)]
p = lambda t: ctypes.c_void_p(t.data_ptr())
I64 = ctypes.c_int64
torch.manual_seed(0)
for T,B,S in sizes:
    g0 = torch.randn(T,B,3*S); w = torch.randn(3*S, S)*0.1; h0 = torch.randn(B,S); c0 = torch.randn(B,S)
    out = torch.empty(T,B,S); cells = torch.empty(T,B,S); cn = torch.empty(B,S)
    go = torch.randn(T,B,S); gcn = torch.randn(B,S); dg = torch.empty(T,B,3*S); dh0 = torch.empty(B,S); dc0 = torch.empty(B,S)
    g = g0.clone()
    def fwd(l):
        g.copy_(g0)
        t = time.perf_counter()
        r = l.prl_lltm_sequence_forward_cpu(p(g), p(w), I64(S), p(h0), p(c0), p(out), p(cells), p(cn), I64(T), I64(B), I64(S), 0)
        t = time.perf_counter() - t; assert r == 0; return t
    def bwd(l):
        t = time.perf_counter()
        r = l.prl_lltm_sequence_backward_cpu(p(go), p(gcn), p(g), p(w), I64(S), p(c0), p(cells), p(dg), p(dh0), p(dc0), I64(T), I64(B), I64(S), 0)
        t = time.perf_counter() - t; assert r == 0; return t
    res = {(k, i): [] for k in ('fwd', 'bwd') for i in (0, 1)}
    outs = []
    for i in (0, 1):
        fwd(libs[i]); bwd(libs[i]); outs.append((out.clone(), dg.clone()))
    for r in range(rounds):
        order = [0, 1]; random.shuffle(order)
        for i in order:
            for _ in range(3): fwd(libs[i])
            res[('fwd', i)].append(min(fwd(libs[i]) for _ in range(3)))
            res[('bwd', i)].append(min(bwd(libs[i]) for _ in range(3)))
    md = {k: statistics.median(v) * 1e6 for k, v in res.items()}
    dmax = (outs[0][0] - outs[1][0]).abs().max().item()
    print(f"({T},{B},{S}) fwd A {md[('fwd',0)]:8.1f} B {md[('fwd',1)]:8.1f} us B/A {md[('fwd',1)]/md[('fwd',0)]:.3f} | "
          f"bwd A {md[('bwd',0)]:8.1f} B {md[('bwd',1)]:8.1f} B/A {md[('bwd',1)]/md[('bwd',0)]:.3f} | max|dout| {dmax:.2e}", flush=True)
