/* threads_test.c - several threads calling the CPU sequence functions at once while the
 * library splits each call among its own workers (one call holds them, the others run on
 * their own thread), then among the threads of a runner with thread numbers (each caller
 * leads a team of its own, as with an OpenMP runtime; the parts split by thread number):
 * every result is bit-for-bit the single-threaded one.  Two shapes: one the library splits
 * by batch rows, one it runs step by step, each step's product and cells as rounds of one
 * parallel region (prl::run_rounds).  Built by CMake (ctest: c_threads); `make tsan` runs it
 * under ThreadSanitizer. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pyroundlib.h"

enum { CALLERS = 6, ITERATIONS = 20 };

/* A prl_parallel_fn on POSIX threads, started for each region and joined at its end, and
 * its prl_thread_num_fn. */
static __thread int team_number;
struct Member {
    void (*fn)(void *);
    void *data;
    int number;
};
static void *member_main(void *arg) {
    struct Member *m = arg;
    team_number = m->number;
    m->fn(m->data);
    return NULL;
}
static void pthread_runner(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags) {
    enum { MOST = 8 };
    pthread_t threads[MOST];
    struct Member members[MOST];
    unsigned started = 1;
    (void)flags;
    for (; started < num_threads && started < MOST; ++started) {
        members[started] = (struct Member){fn, data, (int)started};
        if (pthread_create(&threads[started], NULL, member_main, &members[started]) != 0) break;
    }
    const int outer = team_number;
    team_number = 0;
    fn(data);
    team_number = outer;
    for (unsigned k = 1; k < started; ++k) pthread_join(threads[k], NULL);
}
static int pthread_number(void) { return team_number; }

/* One shape's inputs and the one-thread results. */
struct Shape {
    const char *split;
    int64_t T, B, S;
    double *w, *h0, *c0, *grad, *gates_in;
    double *want; /* gates, output, cells, c_n, d_gates, d_h0, d_c0, one after the other */
};

static int64_t results_size(const struct Shape *s) {
    const int64_t gates = s->T * s->B * 3 * s->S, states = s->T * s->B * s->S, cell = s->B * s->S;
    return 2 * gates + 2 * states + 3 * cell;
}

/* Runs the forward and backward of s into r (results_size doubles); non-zero on failure. */
static int run(const struct Shape *s, double *r) {
    const int64_t T = s->T, B = s->B, S = s->S, gates = T * B * 3 * S, states = T * B * S, cell = B * S;
    double *g = r, *output = g + gates, *cells = output + states, *c_n = cells + states, *d_gates = c_n + cell;
    double *d_h0 = d_gates + gates, *d_c0 = d_h0 + cell;
    memcpy(g, s->gates_in, (size_t)gates * sizeof *g);
    return prl_lltm_sequence_forward_cpu(g, s->w, S, s->h0, s->c0, output, cells, c_n, T, B, S, PRL_FLOAT64) !=
               PRL_SUCCESS ||
           prl_lltm_sequence_backward_cpu(s->grad, c_n, g, s->w, S, s->c0, cells, d_gates, d_h0, d_c0, T, B, S,
                                          PRL_FLOAT64) != PRL_SUCCESS;
}

static void *caller(void *shape) {
    const struct Shape *s = shape;
    const size_t bytes = (size_t)results_size(s) * sizeof(double);
    double *r = malloc(bytes);
    long bad = r == NULL;
    for (int i = 0; i < ITERATIONS && !bad; ++i) bad = run(s, r) || memcmp(r, s->want, bytes) != 0;
    free(r);
    return (void *)bad;
}

static double *filled(int64_t n, unsigned *seed, double scale) {
    double *a = malloc((size_t)n * sizeof *a);
    for (int64_t i = 0; a != NULL && i < n; ++i) {
        *seed = *seed * 1103515245u + 12345u;
        a[i] = ((*seed >> 8 & 0xffff) / 65536.0 - 0.5) * scale;
    }
    return a;
}

int main(void) {
    /* rows: 10 rows in two parts; step by step: 2 rows, each step's product in 4 column parts
     * (24 steps of 2^18.6 multiply-adds, at least 2^21 a part over the sequence) */
    struct Shape shapes[] = {{"rows", 4, 10, 128}, {"step by step", 24, 2, 256}};
    unsigned seed = 2024;
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; ++k) {
        struct Shape *s = &shapes[k];
        const int64_t states = s->T * s->B * s->S, cell = s->B * s->S;
        s->w = filled(3 * s->S * s->S, &seed, 0.2);
        s->h0 = filled(cell, &seed, 1.0);
        s->c0 = filled(cell, &seed, 1.0);
        s->grad = filled(states, &seed, 1.0);
        s->gates_in = filled(3 * states, &seed, 1.0);
        s->want = malloc((size_t)results_size(s) * sizeof(double));
        if (!s->w || !s->h0 || !s->c0 || !s->grad || !s->gates_in || !s->want) {
            fprintf(stderr, "threads_test: out of memory\n");
            return 1;
        }
        prl_set_cpu_threads(1);
        if (run(s, s->want)) {
            fprintf(stderr, "threads_test: single-threaded call failed: %s\n", prl_last_error());
            return 1;
        }
        prl_set_cpu_threads(4);
        for (int numbered = 0; numbered < 2; ++numbered) {
            prl_set_cpu_parallel(numbered ? pthread_runner : NULL);
            prl_set_cpu_thread_num(numbered ? pthread_number : NULL);
            pthread_t threads[CALLERS];
            long failed = 0;
            for (int c = 0; c < CALLERS; ++c)
                if (pthread_create(&threads[c], NULL, caller, s) != 0) {
                    fprintf(stderr, "pthread_create\n");
                    return 1;
                }
            for (int c = 0; c < CALLERS; ++c) {
                void *bad;
                pthread_join(threads[c], &bad);
                failed += (long)bad;
            }
            const char *by = numbered ? "a numbered runner's threads" : "the library's workers";
            if (failed) {
                fprintf(stderr, "threads_test (%s, %s): %ld caller(s) got other results\n", s->split, by, failed);
                return 1;
            }
            printf("threads_test (%s, %s): %d callers x %d calls, each split 4 ways: all bit-for-bit the "
                   "one-thread results\n", s->split, by, CALLERS, ITERATIONS);
        }
        prl_set_cpu_parallel(NULL);
        prl_set_cpu_thread_num(NULL);
        free(s->w), free(s->h0), free(s->c0), free(s->grad), free(s->gates_in), free(s->want);
    }
    return 0;
}
