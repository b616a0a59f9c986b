"""Upper bound of forming a pack's row indices in one launch: Pack.reverse / previous taken from a
cache keyed on the sizes (free) against formed each call (as now). Interleaved rounds."""
import os, sys, time, statistics, random, torch, pyroundlib
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pack_profile import make, runner
from pyroundlib import _packed
torch.backends.cuda.matmul.allow_tf32 = False
orig_rev, orig_prev = _packed.Pack.__dict__["reverse"], _packed.Pack.__dict__["previous"]
cache = {}
def cached(name, orig):
    def get(self):
        key = (name, tuple(self.host_sizes), self.device)
        if key not in cache:
            cache[key] = orig.func(self)
        return cache[key]
    return property(get)
def free(on):
    if on:
        _packed.Pack.reverse = cached("r", orig_rev); _packed.Pack.previous = cached("p", orig_prev)
    else:
        _packed.Pack.reverse = orig_rev; _packed.Pack.previous = orig_prev
def wall(run, n):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): run()
    torch.cuda.synchronize(); return (time.perf_counter() - t) / n * 1e6
CASES = [((8,32,8,64), torch.float32, "fwd+bwd"), ((8,32,8,64), torch.bfloat16, "fwd+bwd"),
         ((50,64,256,512), torch.bfloat16, "inference"), ((50,64,256,512), torch.bfloat16, "fwd+bwd"),
         ((50,64,256,512), torch.float32, "inference"), ((100,256,512,1024), torch.bfloat16, "inference"),
         ((100,256,512,1024), torch.bfloat16, "fwd+bwd"), ((200,64,128,768), torch.bfloat16, "inference")]
for shape, dtype, kind in CASES:
    ours, x, pack = make(*shape, dtype)
    run = runner(ours, pack, kind)
    n = 10 if shape[0] * shape[1] * shape[3] < 2**22 else 3
    for on in (False, True):
        free(on); run(); run()
    ratios, t = [], {False: [], True: []}
    for r in range(9):
        order = [False, True]; random.shuffle(order)
        got = {}
        for on in order:
            free(on); got[on] = wall(run, n)
            t[on].append(got[on])
        ratios.append(got[True] / got[False])
    free(False)
    print(f"{shape} {str(dtype)[6:]} {kind} packed: formed each call {statistics.median(t[False]):.0f} us, "
          f"free {statistics.median(t[True]):.0f} us, free / formed {statistics.median(ratios):.3f} "
          f"({min(ratios):.2f}-{max(ratios):.2f})", flush=True)
