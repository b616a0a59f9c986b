import json, os, statistics, subprocess, sys, time
def worker():
    import torch, pyroundlib
    out = {}
    def t(f, n):
        for _ in range(10): f()
        ts = []
        for _ in range(7):
            s = time.perf_counter()
            for _ in range(n): f()
            ts.append((time.perf_counter() - s) / n * 1e6)
        return statistics.median(ts)
    for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        for e in (16, 20, 22):
            x = (torch.randn(1 << e) * 4).to(dt)
            n = 400 if e == 16 else 100 if e == 20 else 25
            ours, peer = [], []
            for _ in range(3):
                ours.append(t(lambda: pyroundlib.round_ste(x), n)); peer.append(t(lambda: torch.round(x), n))
            out[f"2^{e} {str(dt)[6:]}"] = [statistics.median(ours), statistics.median(peer)]
    print("JSON" + json.dumps(out))
def main(old, new, rounds):
    times = {"old": [], "new": []}
    for r in range(rounds):
        for which in (["old", "new"] if r % 2 == 0 else ["new", "old"]):
            env = dict(os.environ, PYROUNDLIB_LIBRARY=old if which == "old" else new)
            p = subprocess.run([sys.executable, __file__, "worker"], env=env, capture_output=True, text=True)
            line = [l for l in p.stdout.splitlines() if l.startswith("JSON")]
            if not line: print(which, "failed", p.stderr[-2000:]); continue
            times[which].append(json.loads(line[0][4:]))
    o, n = times["old"], times["new"]
    print("round_ste forward / torch.round (medians over processes), old -> new; new/old time")
    for k in o[0]:
        ro = statistics.median(a[k][0] / a[k][1] for a in o); rn = statistics.median(b[k][0] / b[k][1] for b in n)
        print(f"{k}: {ro:.3f} -> {rn:.3f}; ours {statistics.median(a[k][0] for a in o):.1f} -> {statistics.median(b[k][0] for b in n):.1f} us, new/old {statistics.median(b[k][0]/a[k][0] for a, b in zip(o, n)):.3f}", flush=True)
if __name__ == "__main__":
    worker() if sys.argv[1] == "worker" else main(sys.argv[2], sys.argv[3], int(sys.argv[4]))
