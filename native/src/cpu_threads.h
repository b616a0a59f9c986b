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

#include <functional>

namespace prl {

// The most threads a call may use (the caller included), set by prl_set_cpu_threads; 1
// until then.
int64_t cpu_threads();

// Runs part(i) for every i in [0, parts) on up to cpu_threads() threads, the calling thread
// included (the runner's team, else the library's workers), and returns when all have
// returned.  Parts are handed out one at a time, so a thread that starts late takes fewer.
// part must not throw (whatever it allocates is allocated before the call).  Without a
// runner, falls back to the calling thread alone where the build has no threads, when
// another call holds the workers, or when a worker cannot be started.
void run_parts(int64_t parts, const std::function<void(int64_t)> &part);

}  // namespace prl
