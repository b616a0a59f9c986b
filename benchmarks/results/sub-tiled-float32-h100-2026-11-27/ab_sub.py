"""A/B in alternating fresh processes: (old build, default), (new build, default), (new build, =1).
python ab_sub.py main OLD_LIB NEW_LIB ROUNDS   |   python ab_sub.py worker"""
import json, os, statistics, subprocess, sys

LAYER = [(200, 64, 128, 768), (100, 64, 256, 1024), (100, 256, 512, 1024)]
SEQ = [(200, 64, 128, 768), (100, 64, 256, 1024), (100, 256, 512, 1024)]

def worker():
    import torch, pyroundlib, ctypes
    from pyroundlib import sequence
    torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False
    out = {}
    lib = pyroundlib._ffi.library()
    fits = {}
    for dt in ("float32", "float64"):
        code = pyroundlib._common.DTYPE_CODES[getattr(torch, dt)]
        for b in (16, 32, 64, 128, 256):
            for s in (512, 768, 1024, 1536):
                f = ctypes.c_int(); lib.prl_lltm_sequence_cuda_fits(b, s, code, 0, ctypes.byref(f)); fits[f"{dt} B={b} S={s}"] = f.value
    out["fits"] = fits
    peer = os.environ.get("PEER") == "1"
    def timeit(f, calls=2, reps=3):
        for _ in range(2): f()
        ts = []
        for _ in range(reps):
            torch.cuda.synchronize(); a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(calls): f()
            b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) / calls)
        return statistics.median(ts)
    for T, B, I, S in LAYER:
        kw = dict(device="cuda", dtype=torch.float32)
        torch.manual_seed(0)
        layer = (torch.nn.LSTM(I, S, num_layers=2, bidirectional=True, **kw) if peer else
                 pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, **kw))
        x = torch.randn(T, B, I, **kw, requires_grad=True)
        gen = torch.Generator().manual_seed(T * 1000 + B)
        lengths = torch.randint(T // 2, T + 1, (B,), generator=gen).tolist(); lengths[0] = T
        pack = torch.nn.utils.rnn.pack_padded_sequence(x.detach(), lengths, enforce_sorted=False)
        pack = torch.nn.utils.rnn.PackedSequence(pack.data.requires_grad_(), pack.batch_sizes, pack.sorted_indices, pack.unsorted_indices)
        for name, given in (("padded", x), ("packed", pack)):
            is_pack = name == "packed"
            params = [given.data if is_pack else given, *layer.parameters()]
            def train():
                o, (h, c) = layer(given)
                return torch.autograd.grad((o.data if is_pack else o).sum() + h.sum() + c.sum(), params)
            def infer():
                with torch.inference_mode():
                    return layer(given)
            out[f"layer {T},{B},{I},{S} f32 {name} fwd+bwd"] = timeit(train)
            out[f"layer {T},{B},{I},{S} f32 {name} inference"] = timeit(infer)
        if not peer:
            out[f"route {T},{B},{I},{S}"] = sequence._route(x, T, B, I, S) + " / pack " + sequence._packed_route(x, T, B, I, S)
    for T, B, I, S in SEQ:
        if peer: break
        kw = dict(device="cuda", dtype=torch.float32)
        torch.manual_seed(0)
        args = [torch.randn(T, B, I, **kw), torch.randn(3 * S, S + I, **kw) / S ** 0.5, torch.randn(3 * S, **kw),
                torch.randn(B, S, **kw), torch.randn(B, S, **kw)]
        for a in args: a.requires_grad_()
        def train():
            o, (h, c) = pyroundlib.lltm_sequence(args[0], args[1], args[2], (args[3], args[4]))
            return torch.autograd.grad(o.sum() + h.sum() + c.sum(), args)
        def infer():
            with torch.inference_mode():
                return pyroundlib.lltm_sequence(args[0], args[1], args[2], (args[3], args[4]))
        out[f"seq {T},{B},{I},{S} f32 fwd+bwd"] = timeit(train)
        out[f"seq {T},{B},{I},{S} f32 inference"] = timeit(infer)
    print("JSON" + json.dumps(out))

def main(old, new, rounds):
    configs = {"old": dict(PYROUNDLIB_LIBRARY=old), "new": dict(PYROUNDLIB_LIBRARY=new),
               "new=1": dict(PYROUNDLIB_LIBRARY=new, PYROUNDLIB_PERSISTENT_SEQUENCE="1"),
               "nn.LSTM": dict(PYROUNDLIB_LIBRARY=new, PEER="1")}
    times = {k: [] for k in configs}
    for r in range(rounds):
        names = list(configs) if r % 2 == 0 else list(reversed(configs))
        for which in names:
            if which == "nn.LSTM" and r > 0: continue
            env = dict(os.environ, **configs[which]); env.pop("PYROUNDLIB_PERSISTENT_SEQUENCE", None) if which != "new=1" else None
            p = subprocess.run([sys.executable, __file__, "worker"], env=env, capture_output=True, text=True)
            line = [l for l in p.stdout.splitlines() if l.startswith("JSON")]
            if not line:
                print(which, "failed", p.stdout[-2000:], p.stderr[-3000:], flush=True); continue
            times[which].append(json.loads(line[0][4:]))
            print(which, "done", flush=True)
    o, n, n1, peer = times["old"], times["new"], times["new=1"], times["nn.LSTM"]
    print("fits old -> new:")
    for k in o[0]["fits"]:
        print(f"  {k}: {o[0]['fits'][k]} -> {n[0]['fits'][k]}")
    med = lambda runs, k: statistics.median(r[k] for r in runs)
    for k in o[0]:
        if k == "fits": continue
        if k.startswith("route"):
            print(f"{k}: old {o[0][k]} -> new {n[0][k]} ; =1 {n1[0][k]}"); continue
        rat = lambda a, b: statistics.median(y[k] / x[k] for x, y in zip(a, b))
        line = (f"{k}: old {med(o, k):.3f}  new {med(n, k):.3f}  new=1 {med(n1, k):.3f} ms | new/old {rat(o, n):.3f}"
                f"  new=1/new {rat(n, n1):.3f}")
        if peer and k in peer[0]:
            line += f" | nn.LSTM {peer[0][k]:.3f} ms, best/nn.LSTM {min(med(n, k), med(n1, k)) / peer[0][k]:.3f}"
        print(line, flush=True)

if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker()
    else:
        main(sys.argv[2], sys.argv[3], int(sys.argv[4]))
