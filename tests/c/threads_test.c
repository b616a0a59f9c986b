/* threads_test.c - several threads calling the CPU sequence functions at once while the
 * library splits each call among its own workers (one call holds them, the others run on
 * their own thread): every result is bit-for-bit the single-threaded one.  Built by CMake
 * (ctest: c_threads); `make tsan` runs it under ThreadSanitizer. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pyroundlib.h"

enum { T = 4, B = 10, S = 128, CALLERS = 6, ITERATIONS = 20 };
enum { GATES = T * B * 3 * S, STATES = T * B * S, CELL = B * S };

static double w[3 * S * S], h0[CELL], c0[CELL], grad[STATES], gates_in[GATES];

struct Results {
    double gates[GATES], output[STATES], cells[STATES], c_n[CELL], d_gates[GATES], d_h0[CELL], d_c0[CELL];
};
static struct Results want;

static int run(struct Results *r) {
    memcpy(r->gates, gates_in, sizeof gates_in);
    return prl_lltm_sequence_forward_cpu(r->gates, w, S, h0, c0, r->output, r->cells, r->c_n, T, B, S,
                                         PRL_FLOAT64) != PRL_SUCCESS ||
           prl_lltm_sequence_backward_cpu(grad, r->c_n, r->gates, w, S, c0, r->cells, r->d_gates, r->d_h0, r->d_c0,
                                          T, B, S, PRL_FLOAT64) != PRL_SUCCESS;
}

static void *caller(void *unused) {
    (void)unused;
    struct Results *r = malloc(sizeof *r);
    long bad = r == NULL;
    for (int i = 0; i < ITERATIONS && !bad; ++i) bad = run(r) || memcmp(r, &want, sizeof want) != 0;
    free(r);
    return (void *)bad;
}

int main(void) {
    unsigned seed = 2024;
#define NEXT() (((seed = seed * 1103515245u + 12345u) >> 8 & 0xffff) / 65536.0 - 0.5)
    for (int i = 0; i < 3 * S * S; ++i) w[i] = NEXT() * 0.2;
    for (int i = 0; i < CELL; ++i) { h0[i] = NEXT(); c0[i] = NEXT(); }
    for (int i = 0; i < STATES; ++i) grad[i] = NEXT();
    for (int i = 0; i < GATES; ++i) gates_in[i] = NEXT();
#undef NEXT
    if (run(&want)) { fprintf(stderr, "threads_test: single-threaded call failed: %s\n", prl_last_error()); return 1; }
    prl_set_cpu_threads(4);
    pthread_t threads[CALLERS];
    long failed = 0;
    for (int k = 0; k < CALLERS; ++k)
        if (pthread_create(&threads[k], NULL, caller, NULL) != 0) { fprintf(stderr, "pthread_create\n"); return 1; }
    for (int k = 0; k < CALLERS; ++k) {
        void *bad;
        pthread_join(threads[k], &bad);
        failed += (long)bad;
    }
    if (failed) { fprintf(stderr, "threads_test: %ld caller(s) got other results\n", failed); return 1; }
    printf("threads_test: %d callers x %d calls, each split 4 ways: all bit-for-bit the one-thread results\n",
           CALLERS, ITERATIONS);
    return 0;
}
