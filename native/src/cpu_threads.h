// cpu_threads.h - the library's CPU worker threads: one fork-join per call, for loops whose
// parts need no synchronisation with each other (the batch rows of a recurrence).
//
// Why not OpenMP: the library is loaded into processes whose torch brings its own OpenMP
// runtime (libgomp or libiomp, bundled in the wheel).  A second runtime means a second pool
// of spinning threads competing for the same cores, and a runtime library the wheel would
// have to ship.  These threads sleep on a condition variable between calls and never spin
// while idle.
#pragma once

#include <stdint.h>

#include <functional>

namespace prl {

// The most threads a call may use (the caller included), set by prl_set_cpu_threads; 1
// until then.
int64_t cpu_threads();

// Runs part(i) for every i in [0, parts) on the calling thread and up to cpu_threads() - 1
// workers, and returns when all have returned.  Parts are handed out one at a time, so a
// worker that wakes late takes fewer.  part must not throw (whatever it allocates is
// allocated before the call).  Falls back to the calling thread alone where the build has
// no threads, when another call holds the workers, or when a worker cannot be started.
void run_parts(int64_t parts, const std::function<void(int64_t)> &part);

}  // namespace prl
