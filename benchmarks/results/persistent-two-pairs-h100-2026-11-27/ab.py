"""A/B of two library builds in alternating fresh processes: persistent tiles of two pairs a thread.
python ab.py main OLD_LIB NEW_LIB ROUNDS   |   python ab.py worker LIB"""
import json, os, statistics, subprocess, sys, time

LAYER = [(200, 64, 128, 768), (100, 64, 256, 1024), (100, 128, 256, 512)]
SEQ = [(200, 64, 128, 768, "bfloat16"), (100, 128, 256, 512, "bfloat16")]

def worker():
    import torch, pyroundlib
    from pyroundlib import sequence
    torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False
    out = {}
    lib = pyroundlib._ffi.library(); import ctypes
    fits = {}
    for dt, code in (("bfloat16", pyroundlib._common.DTYPE_CODES[torch.bfloat16]),):
        for b in (16, 32, 64, 128, 256):
            for s in (512, 768, 1024, 1536):
                f = ctypes.c_int(); lib.prl_lltm_sequence_cuda_fits(b, s, code, 0, ctypes.byref(f)); fits[f"{dt} B={b} S={s}"] = f.value
    out["fits"] = fits
    def timeit(f, calls=3, reps=5):
        for _ in range(2): f()
        ts = []
        for _ in range(reps):
            torch.cuda.synchronize(); a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(calls): f()
            b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) / calls)
        return statistics.median(ts)
    for T, B, I, S in LAYER:
        dtype = torch.bfloat16; kw = dict(device="cuda", dtype=dtype)
        torch.manual_seed(0)
        layer = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, **kw)
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
            out[f"layer {T},{B},{I},{S} bf16 {name} fwd+bwd"] = timeit(train)
            out[f"layer {T},{B},{I},{S} bf16 {name} inference"] = timeit(infer)
            # a checksum against the float64 reference is the tests' job; here the route
        out[f"route {T},{B},{I},{S}"] = sequence._route(x, T, B, I, S) + " / pack " + sequence._packed_route(x, T, B, I, S)
    for T, B, I, S, dt in SEQ:
        dtype = getattr(torch, dt); kw = dict(device="cuda", dtype=dtype)
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
        out[f"seq {T},{B},{I},{S} {dt} fwd+bwd"] = timeit(train)
        out[f"seq {T},{B},{I},{S} {dt} inference"] = timeit(infer)
    print("JSON" + json.dumps(out))

def main(old, new, rounds):
    times = {"old": [], "new": []}
    order = []
    for r in range(rounds):
        order += (["old", "new"] if r % 2 == 0 else ["new", "old"])
    for which in order:
        env = dict(os.environ, PYROUNDLIB_LIBRARY=old if which == "old" else new)
        p = subprocess.run([sys.executable, __file__, "worker"], env=env, capture_output=True, text=True)
        line = [l for l in p.stdout.splitlines() if l.startswith("JSON")]
        if not line:
            print(which, "failed", p.stdout[-2000:], p.stderr[-3000:], flush=True); continue
        times[which].append(json.loads(line[0][4:]))
        print(which, "done", flush=True)
    o, n = times["old"], times["new"]
    print("fits old/new:")
    for k in o[0]["fits"]:
        print(f"  {k}: {o[0]['fits'][k]} -> {n[0]['fits'][k]}")
    for k in o[0]:
        if k == "fits": continue
        if k.startswith("route"):
            print(f"{k}: {o[0][k]} -> {n[0][k]}"); continue
        ratios = [b[k] / a[k] for a, b in zip(o, n)]
        print(f"{k}: old {statistics.median(a[k] for a in o):.3f} ms, new {statistics.median(b[k] for b in n):.3f} ms, "
              f"new/old {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")

if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker()
    else:
        main(sys.argv[2], sys.argv[3], int(sys.argv[4]))
