"""A/B in alternating fresh processes of two library builds: packed float32 LLTMLayer (TF32 off).
python ab_pack.py main OLD.so NEW.so ROUNDS   |   python ab_pack.py worker"""
import json, os, statistics, subprocess, sys

SIZES = [(200, 64, 128, 768), (100, 64, 256, 1024), (100, 256, 512, 1024)][:int(os.environ.get("AB_N", "3"))]

def worker():
    import torch, pyroundlib
    from torch.nn.utils.rnn import pack_padded_sequence
    torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False
    from torch.profiler import profile, ProfilerActivity
    def kernels(f):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            f(); f(); torch.cuda.synchronize()
        return sum(e.self_device_time_total for e in prof.key_averages()
                   if e.device_type == torch.autograd.DeviceType.CUDA) / 2 / 1e3
    def timeit(f, calls=2, reps=5):
        for _ in range(5): f()
        ts = []
        for _ in range(reps):
            torch.cuda.synchronize(); a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(calls): f()
            b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) / calls)
        return statistics.median(ts)
    out = {}
    for T, B, I, S in SIZES:
        kw = dict(device="cuda", dtype=torch.float32)
        torch.manual_seed(0)
        layer = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, **kw)
        x = torch.randn(T, B, I, **kw, requires_grad=True)
        lengths = torch.randint(T // 2, T + 1, (B,))
        params = [x, *layer.parameters()]
        def train():
            o, (h, c) = layer(pack_padded_sequence(x, lengths, enforce_sorted=False))
            return torch.autograd.grad(o.data.sum() + h.sum() + c.sum(), params)
        def infer():
            with torch.inference_mode():
                return layer(pack_padded_sequence(x, lengths, enforce_sorted=False))
        name = f"pack {T},{B},{I},{S} f32"
        out[f"{name} fwd+bwd"] = timeit(train)
        out[f"{name} fwd+bwd, kernel time"] = kernels(train)
        out[f"{name} inference"] = timeit(infer)
        out[f"{name} inference, kernel time"] = kernels(infer)
    print("JSON" + json.dumps(out))

def main(old, new, rounds):
    libs = {"old": old, "new": new}
    times = {"old": [], "new": []}
    for r in range(rounds):
        for which in (["old", "new"] if r % 2 == 0 else ["new", "old"]):
            env = dict(os.environ, PYROUNDLIB_LIBRARY=libs[which])
            p = subprocess.run([sys.executable, __file__, "worker"], env=env, capture_output=True, text=True)
            line = [l for l in p.stdout.splitlines() if l.startswith("JSON")]
            if not line:
                print(which, "failed", p.stdout[-2000:], p.stderr[-3000:], flush=True); continue
            times[which].append(json.loads(line[0][4:]))
    o, n = times["old"], times["new"]
    for k in o[0]:
        ratios = [b[k] / a[k] for a, b in zip(o, n)]
        print(f"{k}: old {statistics.median(a[k] for a in o):.3f} ms | new {statistics.median(b[k] for b in n):.3f} ms,"
              f" new/old {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})", flush=True)

if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker()
    else:
        main(sys.argv[2], sys.argv[3], int(sys.argv[4]))
