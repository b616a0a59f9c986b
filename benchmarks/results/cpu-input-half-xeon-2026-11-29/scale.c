// per-part scaling of the CPU sequence forward: P pthreads each running its own one-thread calls
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#include <sched.h>
#include "pyroundlib.h"
static int T, B, S, N, P;
static pthread_barrier_t bar;
static double *res;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }
static void *run(void *arg) {
    int id = (int)(intptr_t)arg;
    cpu_set_t cs; CPU_ZERO(&cs); CPU_SET(id, &cs); pthread_setaffinity_np(pthread_self(), sizeof cs, &cs);
    size_t g = (size_t)T * B * 3 * S, s = (size_t)B * S;
    float *gates0 = malloc(g * 4), *gates = malloc(g * 4), *w = malloc((size_t)3 * S * S * 4), *h0 = malloc(s * 4), *c0 = malloc(s * 4);
    float *out = malloc((size_t)T * s * 4), *cells = malloc((size_t)T * s * 4), *cn = malloc(s * 4);
    srand(id + 1);
    for (size_t i = 0; i < g; ++i) gates0[i] = (rand() / (float)RAND_MAX - 0.5f);
    for (size_t i = 0; i < (size_t)3 * S * S; ++i) w[i] = (rand() / (float)RAND_MAX - 0.5f) * 0.1f;
    for (size_t i = 0; i < s; ++i) h0[i] = c0[i] = rand() / (float)RAND_MAX - 0.5f;
    double *ts = malloc(N * sizeof(double));
    pthread_barrier_wait(&bar);
    for (int k = 0; k < N; ++k) {
        memcpy(gates, gates0, g * 4);
        double t0 = now();
        prl_lltm_sequence_forward_cpu(gates, w, S, h0, c0, out, cells, cn, T, B, S, 0);
        ts[k] = now() - t0;
    }
    qsort(ts, N, sizeof(double), cmp);
    res[id] = ts[N / 2];
    return NULL;
}
int main(int argc, char **argv) {
    T = atoi(argv[1]); B = atoi(argv[2]); S = atoi(argv[3]); N = atoi(argv[4]);
    prl_set_cpu_threads(1);
    int ps[] = {1, 2, 4, 8, 16};
    for (int pi = 0; pi < 5; ++pi) {
        P = ps[pi];
        pthread_barrier_init(&bar, NULL, P);
        res = calloc(P, sizeof(double));
        pthread_t th[64];
        for (int i = 0; i < P; ++i) pthread_create(&th[i], NULL, run, (void *)(intptr_t)(i * (argc > 5 ? atoi(argv[5]) : 1)));
        for (int i = 0; i < P; ++i) pthread_join(th[i], NULL);
        double mx = 0, sum = 0; for (int i = 0; i < P; ++i) { sum += res[i]; if (res[i] > mx) mx = res[i]; }
        printf("T=%d B=%d S=%d threads=%2d: per-call median (mean over threads) %8.1f us, max %8.1f us\n", T, B, S, P, 1e6 * sum / P, 1e6 * mx);
        pthread_barrier_destroy(&bar); free(res);
    }
}
