import os, sys, torch, pyroundlib
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pack_profile import make, runner
from torch.profiler import profile, ProfilerActivity
for dtype in (torch.bfloat16,):
    ours, x, pack = make(50, 64, 256, 512, dtype)
    for name, given in (("padded", x), ("packed", pack)):
        run = runner(ours, given, "inference")
        for _ in range(5): run()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(10): run()
            torch.cuda.synchronize()
        ka = prof.key_averages()
        tot = sum(e.self_cpu_time_total for e in ka)
        print(f"== {name} {dtype}: self CPU {tot/10:.0f} us a call, aten ops a call: {sum(e.count for e in ka if e.key.startswith('aten::'))/10:.0f}")
        print(ka.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
