import sys, time, statistics, collections, torch, pyroundlib
from torch.profiler import profile, ProfilerActivity
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = torch.device("cuda")
SHAPES = [((50,64,256,512), torch.bfloat16), ((200,64,128,768), torch.bfloat16), ((8,32,8,64), torch.float32),
          ((200,64,128,768), torch.float32), ((50,64,256,512), torch.float32)]

def make(steps, batch, features, state, dtype):
    kw = dict(device=dev, dtype=dtype)
    gen = torch.Generator().manual_seed(steps * 1000 + batch)
    torch.manual_seed(0)
    ours = pyroundlib.LLTMLayer(features, state, num_layers=2, bidirectional=True, **kw)
    x = torch.randn(steps, batch, features, **kw, requires_grad=True)
    lengths = torch.randint(steps // 2, steps + 1, (batch,), generator=gen).tolist(); lengths[0] = steps
    pack = torch.nn.utils.rnn.pack_padded_sequence(x.detach(), lengths, enforce_sorted=False)
    pack = torch.nn.utils.rnn.PackedSequence(pack.data.requires_grad_(), pack.batch_sizes, pack.sorted_indices, pack.unsorted_indices)
    return ours, x, pack

def runner(layer, given, kind):
    is_pack = isinstance(given, torch.nn.utils.rnn.PackedSequence)
    params = [given.data if is_pack else given, *layer.parameters()]
    if kind == "inference":
        def run():
            with torch.inference_mode():
                return layer(given)
    else:
        def run():
            o, (h, c) = layer(given)
            return torch.autograd.grad((o.data if is_pack else o).sum() + h.sum() + c.sum(), params)
    return run

def wall(run, n=10, reps=5):
    for _ in range(3): run()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(n): run()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t) / n)
    return statistics.median(ts)

def main():
  for (shape, dtype) in SHAPES:
      ours, x, pack = make(*shape, dtype)
      for kind in ("inference", "fwd+bwd"):
          line = []
          for name, given in (("padded", x), ("packed", pack)):
              run = runner(ours, given, kind)
              w = wall(run)
              with profile(activities=[ProfilerActivity.CUDA]) as prof:
                  for _ in range(3): run()
                  torch.cuda.synchronize()
              agg = collections.defaultdict(lambda: [0, 0.0])
              for e in prof.events():
                  if e.device_type == torch.autograd.DeviceType.CUDA:
                      agg[e.name][0] += 1; agg[e.name][1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
              gpu = sum(v[1] for v in agg.values()) / 3
              print(f"{shape} {dtype} {kind} {name}: wall {w*1e6:.0f} us, GPU busy {gpu:.0f} us, launches {sum(v[0] for v in agg.values())/3:.0f}")
              for k, v in sorted(agg.items(), key=lambda kv: -kv[1][1])[:6]:
                  print(f"    {v[1]/3:9.0f} us  x{v[0]/3:5.1f}  {k[:110]}")
          sys.stdout.flush()

if __name__ == "__main__":
    main()
