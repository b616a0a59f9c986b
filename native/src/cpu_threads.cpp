// cpu_threads.cpp - the threads behind prl::run_parts: a runner given by
// prl_set_cpu_parallel (an OpenMP runtime's GOMP_parallel), else the library's own workers.
//
// With a runner, a call is one parallel region of cpu_threads() threads: thread m runs parts
// m, m + cpu_threads(), ... where the runner's thread numbers are known (prl_set_cpu_thread_num),
// else every thread of the team claims parts with an atomic counter until none is left; the
// region's end is the join.
//
// The library's own workers:
// One pool per process, started lazily and grown to the most helpers a call has asked for.
// A call publishes a Job (its part function and two counters) under the pool's mutex and
// wakes as many workers as it wants helpers; every thread, the caller included, claims
// parts with an atomic counter until none is left.  Workers attach to a job under the
// mutex and detach with an atomic decrement, so the caller, which retracts the job under
// the mutex and then waits for the attached count to reach zero, returns only when no
// worker can still touch the Job on its stack.
//
// What cannot go wrong: a second caller while the workers are busy (another Python thread)
// does not wait for them, it runs its parts alone (try_lock); a child process after fork()
// has none of the parent's threads, so it starts a pool of its own (the process id is
// part of the pool); a worker that cannot be started (std::system_error) leaves the parts
// to the threads that could.  The pool is never destroyed: at exit the workers sleep on a
// condition variable that outlives them.
#include "cpu_threads.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <new>

#include "common.h"

#if defined(_WIN32)
#include <process.h>
#define PRL_PROCESS_ID() _getpid()
#else
#include <unistd.h>
#define PRL_PROCESS_ID() getpid()
#endif

// libstdc++ built without a thread model for the target (MinGW-w64's "win32" model before
// GCC 13) has no std::thread: the library then runs on the calling thread alone.
#if defined(__GLIBCXX__) && !defined(_GLIBCXX_HAS_GTHREADS)
#define PRL_HAVE_THREADS 0
#else
#define PRL_HAVE_THREADS 1
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>
#endif

namespace {

std::atomic<int64_t> requested_threads{1};

// prl_set_cpu_parallel's runner and the process that set it (a forked child has the
// runner's pointer but none of its threads).
std::atomic<prl_parallel_fn> runner{nullptr};
std::atomic<long> runner_process{0};

// prl_set_cpu_thread_num's function (omp_get_thread_num of the runner's runtime).
std::atomic<prl_thread_num_fn> thread_num{nullptr};

// A part's claim, on a cache line of its own (each thread writes its own parts' claims).
struct alignas(64) Claim {
    std::atomic<bool> taken{false};
};

// One call's parallel region.  Where the runner's thread numbers are known, the parts are
// split as torch's parallel_for splits its ranges: thread m of a team of `team` runs parts m,
// m + team, ... and nothing else, so an elementwise call's range m is read and written by the
// core whose thread m ran range m of torch's op before it (the sigmoid whose output a round
// reads) and of the same call before.  A thread the runner did not start leaves its parts
// unclaimed, and the caller runs them after the region.  Without thread numbers every thread
// claims the next part until none is left.  Which thread runs a part never changes what it
// computes.  Measured on a 16-core Xeon, thread numbers against claims in arrival order:
// round_ste of 2^16-2^18 floats 0.53-0.67x the time call after call, 2^19-2^21 floats after a
// torch.round of the same input 0.51-0.75x (benchmarks/NOTES.md).
struct Region {
    const std::function<void(int64_t)> *part;
    int64_t parts;
    int64_t team;                     // the threads asked of the runner
    prl_thread_num_fn member;         // the runner's thread numbers, or nullptr
    Claim *claims;                    // with thread numbers: one a part
    std::atomic<int64_t> next{0};     // without: the next part to claim

    void run(int64_t i) {  // part i, unless another thread took it
        if (!claims[i].taken.load(std::memory_order_relaxed) && !claims[i].taken.exchange(true)) (*part)(i);
    }
};

extern "C" {
// The body every thread of the runner's team runs.
static void prl_region_body(void *data) {
    Region &region = *static_cast<Region *>(data);
    if (region.member == nullptr) {
        for (int64_t i; (i = region.next.fetch_add(1)) < region.parts;) (*region.part)(i);
        return;
    }
    for (int64_t i = region.member(); i >= 0 && i < region.parts; i += region.team) region.run(i);
}
}

#if PRL_HAVE_THREADS

struct Job {
    const std::function<void(int64_t)> *part;
    int64_t parts;
    std::atomic<int64_t> next{0}, done{0}, attached{0};

    void take() {  // runs unclaimed parts until none is left
        for (int64_t i; (i = next.fetch_add(1)) < parts;) {
            (*part)(i);
            done.fetch_add(1);
        }
    }
};

class Pool {
  public:
    explicit Pool(long process) : process(process) {}
    const long process;  // the process whose threads these are
    std::mutex call;     // held by the one call that uses the workers

    void run(Job &job, int64_t helpers) {  // with `call` held
        try {
            while (workers < helpers) {
                std::thread(&Pool::work, this).detach();
                ++workers;
            }
        } catch (const std::system_error &) {
            // no more threads: the parts are shared among those there are
        }
        {
            std::lock_guard<std::mutex> lock(mutex);
            current = &job;
            ++generation;
        }
        for (int64_t k = 0; k < std::min(helpers, workers); ++k) wake.notify_one();
        job.take();
        while (job.done.load() < job.parts) std::this_thread::yield();
        {
            std::lock_guard<std::mutex> lock(mutex);
            current = nullptr;  // no worker attaches from here on
        }
        while (job.attached.load() != 0) std::this_thread::yield();
    }

  private:
    std::mutex mutex;
    std::condition_variable wake;
    Job *current = nullptr;   // guarded by mutex
    uint64_t generation = 0;  // guarded by mutex: bumped for every job
    int64_t workers = 0;      // guarded by call

    void work() {
        uint64_t seen = 0;
        std::unique_lock<std::mutex> lock(mutex);
        for (;;) {
            // A timed wait, not wait(lock): libstdc++ 12 versions the out-of-line
            // condition_variable::wait GLIBCXX_3.4.30, past what manylinux_2_34 allows
            // (3.4.29); the timed wait is inline (pthread_cond_clockwait, glibc 2.30).
            while (generation == seen) wake.wait_for(lock, std::chrono::seconds(10));
            seen = generation;
            Job *job = current;
            if (job == nullptr) continue;  // woken after its job was retracted
            job->attached.fetch_add(1);
            lock.unlock();
            job->take();
            job->attached.fetch_sub(1);  // the last touch: the caller may return from here on
            lock.lock();
        }
    }
};

// This process's pool (nullptr if it cannot be made).
Pool *the_pool() {
    static std::atomic<Pool *> pool{nullptr};
    const long process = (long)PRL_PROCESS_ID();
    Pool *seen = pool.load();
    if (seen != nullptr && seen->process == process) return seen;
    Pool *fresh = new (std::nothrow) Pool(process);
    if (fresh == nullptr) return nullptr;
    // a parent's pool (after fork) is left as it is: its mutexes may be held by threads
    // that do not exist here
    if (pool.compare_exchange_strong(seen, fresh)) return fresh;
    delete fresh;  // another thread of this process made one first
    return seen;
}

#endif  // PRL_HAVE_THREADS

}  // namespace

namespace prl {

int64_t cpu_threads() { return requested_threads.load(); }

void run_parts(int64_t parts, const std::function<void(int64_t)> &part) {
    const int64_t helpers = std::min(parts, cpu_threads()) - 1;
    if (helpers > 0) {
        const prl_parallel_fn run = runner.load();
        if (run != nullptr && runner_process.load() == (long)PRL_PROCESS_ID()) {
            const int64_t team = std::min<int64_t>(cpu_threads(), 1 << 16);
            std::unique_ptr<Claim[]> claims;
            prl_thread_num_fn member = thread_num.load();
            if (member != nullptr) {
                claims.reset(new (std::nothrow) Claim[(size_t)parts]);
                if (!claims) member = nullptr;  // no memory for the claims: claimed in order
            }
            Region region{&part, parts, team, member, claims.get()};
            // The team is always cpu_threads() strong, even for fewer parts (the others have
            // none), as torch's own regions are: its parallel_for opens every region on
            // all of its threads, whatever the chunks (no num_threads clause: pytorch#32008),
            // and libgomp ends the surplus threads of a team smaller than the last one and
            // starts new ones when the next is larger again, at tens of microseconds a thread.
            // Measured with a team of one thread a part on a 16-core Xeon: sigmoid, round_ste and
            // a multiply of 2^16 floats, call after call, 1059 us a chain against 117
            // (benchmarks/NOTES.md).
            run(prl_region_body, &region, (unsigned)team, 0);
            // a runner that ran fewer threads than asked leaves nothing undone
            if (member != nullptr) {
                for (int64_t i = 0; i < parts; ++i) region.run(i);
            } else {
                prl_region_body(&region);
            }
            return;
        }
    }
#if PRL_HAVE_THREADS
    if (helpers > 0) {
        if (Pool *pool = the_pool()) {
            std::unique_lock<std::mutex> call(pool->call, std::try_to_lock);
            if (call.owns_lock()) {
                Job job;
                job.part = &part;
                job.parts = parts;
                pool->run(job, helpers);
                return;
            }
        }
    }
#else
    (void)helpers;
#endif
    for (int64_t i = 0; i < parts; ++i) part(i);
}

namespace {

// Waits until `completed` reaches `round`: spinning a while (a round of a sequence's step
// lasts microseconds), then yielding the core, should the threads outnumber the cores.
void wait_for(const std::atomic<int64_t> &completed, int64_t round) {
    for (int spins = 0; completed.load(std::memory_order_acquire) < round; ++spins) {
        if (spins < (1 << 12)) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        } else {
#if PRL_HAVE_THREADS
            std::this_thread::yield();
#endif
        }
    }
}

}  // namespace

void run_rounds(int64_t rounds, int64_t most, const std::function<int64_t(int64_t)> &parts,
                const std::function<void(int64_t, int64_t)> &part) {
    const int64_t members = std::min(most, cpu_threads());
    // completed: the rounds done; done: the parts of the current round done; claimed[p]: the
    // last round whose part p a thread took (a part is taken by moving it up to the round)
    std::atomic<int64_t> completed{0}, done{0};
    std::unique_ptr<std::atomic<int64_t>[]> claimed(
        members > 1 ? new (std::nothrow) std::atomic<int64_t>[(size_t)most] : nullptr);
    if (!claimed) {  // one thread, or no memory for the claims: in order on the calling thread
        for (int64_t r = 0; r < rounds; ++r)
            for (int64_t p = 0, n = parts(r); p < n; ++p) part(r, p);
        return;
    }
    for (int64_t p = 0; p < most; ++p) claimed[p].store(-1, std::memory_order_relaxed);
    run_parts(members, [&](int64_t member) {
        for (int64_t r = 0; r < rounds; ++r) {
            wait_for(completed, r);
            if (completed.load(std::memory_order_acquire) > r) continue;  // done without this thread
            const int64_t n = parts(r);
            auto take = [&](int64_t p) {
                for (int64_t seen = claimed[p].load(std::memory_order_relaxed); seen < r;) {
                    if (!claimed[p].compare_exchange_weak(seen, r, std::memory_order_relaxed)) continue;
                    part(r, p);
                    // the parts' writes reach the last one's thread along done's
                    // read-modify-writes, and every thread through completed
                    if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
                        done.store(0, std::memory_order_relaxed);
                        completed.store(r + 1, std::memory_order_release);
                    }
                    return;
                }
            };
            if (member < n) take(member);
            for (int64_t p = 0; p < n; ++p) take(p);
        }
    });
}

}  // namespace prl

extern "C" PRL_API prl_status prl_set_cpu_threads(int64_t threads) {
    if (threads < 1)
        return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: argument 'threads' must be >= 1, got %lld", __func__,
                         (long long)threads);
    requested_threads.store(threads);
    return PRL_SUCCESS;
}

extern "C" PRL_API prl_status prl_set_cpu_thread_num(prl_thread_num_fn fn) {
    thread_num.store(fn);
    return PRL_SUCCESS;
}

extern "C" PRL_API int64_t prl_cpu_threads(void) { return prl::cpu_threads(); }

extern "C" PRL_API prl_status prl_set_cpu_parallel(prl_parallel_fn run) {
    runner_process.store((long)PRL_PROCESS_ID());
    runner.store(run);
    return PRL_SUCCESS;
}
