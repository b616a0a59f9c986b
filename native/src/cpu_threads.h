// cpu_threads.h - the library's CPU threads: one fork-join per call, for loops whose parts
// need no synchronisation with each other (the batch rows of a recurrence).
//
// Why the library links no OpenMP runtime: it is loaded into processes whose torch brings
// its own (libgomp or libiomp, bundled in the wheel).  A second runtime would mean a second
// team of threads spinning on the same cores, and a runtime the wheel would have to ship.
// Instead the caller may hand over the GOMP_parallel entry point of the runtime that is
// already there (prl_set_cpu_parallel): the work then runs on torch's own intra-op
// threads, which are usually still spinning from torch's last op and start at once.
// Without one, the library's own workers run it; they sleep on a condition variable
// between calls and never spin while idle.
#pragma once

#include <stdint.h>

#include <algorithm>
#include <functional>

namespace prl {

// The most threads a call may use (the caller included), set by prl_set_cpu_threads; 1
// until then.
int64_t cpu_threads();

// Runs part(i) for every i in [0, parts) on up to cpu_threads() threads, the calling thread
// included (the runner's team, else the library's workers), and returns when all have
// returned.  With the runner's thread numbers, thread m runs parts m, m + cpu_threads(), ...
// (torch's parallel_for split: the same core for the same range, call after call);
// otherwise parts are handed out one at a time, so a thread that starts late takes fewer.
// part must not throw (whatever it allocates is allocated before the call).  Without a
// runner, falls back to the calling thread alone where the build has no threads, when
// another call holds the workers, or when a worker cannot be started.
void run_parts(int64_t parts, const std::function<void(int64_t)> &part);

// A loop whose rounds depend on each other, in one parallel region: part(r, p) for every p in
// [0, parts(r)) (1 <= parts(r) <= most), every part of round r after every part of round
// r - 1 has returned and with its writes visible.  Where a loop would fork and join once a
// round (a sequence's steps, each part's product and cells of its rows and state columns), its
// rounds are joined by an atomic counter instead, at a fraction of a microsecond where a
// fork-join costs several.  Up to min(most, cpu_threads()) threads; member m first takes part m
// of a round (the same columns of the weights every step, so they stay in that core's cache), then
// any part still unclaimed.  A thread waits for a round only while another thread runs one
// of its parts, so the loop completes on however many threads the runner gives, one
// included.  part must not throw.
void run_rounds(int64_t rounds, int64_t most, const std::function<int64_t(int64_t)> &parts,
                const std::function<void(int64_t, int64_t)> &part);

// Elementwise work: body(begin, end) over [0, n) on up to cpu_threads() threads, in ranges
// of whole chunks of `grain` elements (the last chunk shorter): one contiguous range a
// thread, as torch's own parallel_for splits.  Nothing computed per element depends on
// the split, so an elementwise result is bit for bit the same at any thread count.  One
// chunk, or one thread: body(0, n) on the calling thread.  A grain of 32768 elements is
// torch's own for its elementwise ops (at::internal::GRAIN_SIZE): below that, waking a
// thread costs more than it saves.
constexpr int64_t kGrain = 32768;

// Part p's range [begin, end) of [0, n) split in `parts` (1 <= parts <= the chunks) ranges of
// whole chunks of `grain` elements, as run_chunks splits it.
inline void chunk_range(int64_t n, int64_t grain, int64_t parts, int64_t p, int64_t &begin, int64_t &end) {
    const int64_t chunks = (n + grain - 1) / grain;
    begin = p * chunks / parts * grain;
    end = std::min(n, (p + 1) * chunks / parts * grain);
}

template <typename Body> void run_chunks(int64_t n, int64_t grain, Body &&body) {
    const int64_t parts = std::min((n + grain - 1) / grain, cpu_threads());
    if (parts <= 1) {
        if (n > 0) body(int64_t(0), n);
        return;
    }
    run_parts(parts, [&](int64_t p) {
        int64_t begin, end;
        chunk_range(n, grain, parts, p, begin, end);
        body(begin, end);
    });
}

}  // namespace prl
