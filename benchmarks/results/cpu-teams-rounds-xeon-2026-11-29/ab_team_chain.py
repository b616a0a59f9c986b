"""A/B, one process: round_ste in a chain of torch ops, call after call (sigmoid -> round_ste -> mul), with the
library's team of all torch threads (as built before) or of one thread a chunk (PRL_AB_TEAM=parts), against the
same chain with torch.round; interleaved rounds, medians."""
import os, random, statistics, time
import torch, pyroundlib
print("threads", torch.get_num_threads(), torch.__version__, flush=True)
def timed(fn, calls):
    fn(); t0 = time.perf_counter()
    for _ in range(calls): fn()
    return (time.perf_counter() - t0) / calls * 1e6
for dtype in (torch.float32, torch.float64):
    for n in (1 << 16, 1 << 17, 1 << 20):
        x = torch.randn(n, dtype=dtype)
        ours = lambda: pyroundlib.round_ste(torch.sigmoid(x) * 3).mul_(2)
        theirs = lambda: torch.round(torch.sigmoid(x) * 3).mul_(2)
        alone = lambda: pyroundlib.round_ste(x)
        variants = {"chain, team of all": ({}, ours), "chain, team of parts": ({"PRL_AB_TEAM": "parts"}, ours),
                    "chain with torch.round": ({}, theirs),
                    "round alone, team of all": ({}, alone), "round alone, team of parts": ({"PRL_AB_TEAM": "parts"}, alone),
                    "torch.round alone": ({}, lambda: torch.round(x))}
        times = {k: [] for k in variants}
        for _ in range(11):
            order = list(variants); random.shuffle(order)
            for k in order:
                env, fn = variants[k]
                os.environ.pop("PRL_AB_TEAM", None); os.environ.update(env)
                times[k].append(timed(fn, 200))
        os.environ.pop("PRL_AB_TEAM", None)
        print(f"2^{n.bit_length() - 1} {str(dtype)[6:]}: " + "; ".join(f"{k} {statistics.median(v):.1f} us" for k, v in times.items()), flush=True)
