/* abi_test.c - the C ABI used from plain C99, with no Python: results, statuses and
 * messages.  Built by CMake (ctest: c_abi) and by tests/test_c_abi.py. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "pyroundlib.h"

static int failures = 0;

#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            ++failures;                                                    \
        }                                                                  \
    } while (0)

/* The call returns `status` and its message mentions `needle`. */
static void expect_error(prl_status got, prl_status status, const char *needle, int line) {
    if (got != status) {
        fprintf(stderr, "line %d: expected %s, got %s\n", line, prl_status_string(status), prl_status_string(got));
        ++failures;
    } else if (strstr(prl_last_error(), needle) == NULL) {
        fprintf(stderr, "line %d: message \"%s\" does not mention \"%s\"\n", line, prl_last_error(), needle);
        ++failures;
    }
}
#define EXPECT_ERROR(call, status, needle) expect_error((call), (status), (needle), __LINE__)

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

static void test_info(void) {
    CHECK(prl_abi_version() == PRL_ABI_VERSION);
    CHECK(prl_has_cuda() == 0 || prl_has_cuda() == 1);
    CHECK(prl_cuda_architectures() != NULL);
    CHECK(strcmp(prl_status_string(PRL_SUCCESS), "PRL_SUCCESS") == 0);
    CHECK(strcmp(prl_status_string(PRL_ERROR_CUDA), "PRL_ERROR_CUDA") == 0);
    CHECK(strcmp(prl_status_string(12345), "PRL_UNKNOWN_STATUS") == 0);
}

static void test_round_cpu(void) {
    const float xf[] = {-2.5f, -1.5f, -0.5f, -0.4f, 0.0f, 0.5f, 0.6f, 1.5f, 2.5f, 1e30f, INFINITY};
    const float want[] = {-2.0f, -2.0f, -0.0f, -0.0f, 0.0f, 0.0f, 1.0f, 2.0f, 2.0f, 1e30f, INFINITY};
    const int n = (int)(sizeof xf / sizeof xf[0]);
    float yf[sizeof xf / sizeof xf[0]];
    memset(yf, 0xff, sizeof yf); /* NaN pattern: every element must be written */
    CHECK(prl_round_cpu(xf, yf, n, PRL_FLOAT32) == PRL_SUCCESS);
    for (int i = 0; i < n; ++i) CHECK(memcmp(&yf[i], &want[i], sizeof(float)) == 0); /* bitwise: -0.0 */

    const double xd[] = {-0.5, 0.5, 1.5, 2.5, 4503599627370497.0, NAN};
    double yd[6];
    CHECK(prl_round_cpu(xd, yd, 6, PRL_FLOAT64) == PRL_SUCCESS);
    CHECK(yd[0] == 0.0 && signbit(yd[0]) && yd[1] == 0.0 && yd[2] == 2.0 && yd[3] == 2.0);
    CHECK(yd[4] == 4503599627370497.0 && isnan(yd[5]));

    /* float16 bits: 0x3c00 = 1.0, 0x3e00 = 1.5 -> 0x4000 = 2.0, 0x4100 = 2.5 -> 0x4000, 0x3800 = 0.5 -> 0,
     * 0xb800 = -0.5 -> -0 (0x8000), 0x7c00 = inf, 0x0001 = smallest subnormal -> 0 */
    const uint16_t xh[] = {0x3c00, 0x3e00, 0x4100, 0x3800, 0xb800, 0x7c00, 0x0001};
    const uint16_t wh[] = {0x3c00, 0x4000, 0x4000, 0x0000, 0x8000, 0x7c00, 0x0000};
    uint16_t yh[7];
    CHECK(prl_round_cpu(xh, yh, 7, PRL_FLOAT16) == PRL_SUCCESS);
    for (int i = 0; i < 7; ++i) CHECK(yh[i] == wh[i]);

    /* bfloat16 bits: 0x3fc0 = 1.5 -> 0x4000, 0x4020 = 2.5 -> 0x4000, 0xbfc0 = -1.5 -> 0xc000 */
    const uint16_t xb[] = {0x3fc0, 0x4020, 0xbfc0};
    const uint16_t wb[] = {0x4000, 0x4000, 0xc000};
    uint16_t yb[3];
    CHECK(prl_round_cpu(xb, yb, 3, PRL_BFLOAT16) == PRL_SUCCESS);
    for (int i = 0; i < 3; ++i) CHECK(yb[i] == wb[i]);

    /* in place */
    float inplace[] = {0.5f, 1.5f};
    CHECK(prl_round_cpu(inplace, inplace, 2, PRL_FLOAT32) == PRL_SUCCESS);
    CHECK(inplace[0] == 0.0f && inplace[1] == 2.0f);
}

static void test_lltm_cpu(void) {
    enum { B = 2, S = 3 };
    double gates[B * 3 * S], old_cell[B * S], h[B * S], c[B * S];
    for (int i = 0; i < B * 3 * S; ++i) gates[i] = 0.37 * i - 2.9;
    for (int i = 0; i < B * S; ++i) old_cell[i] = 0.21 * i - 0.5;
    CHECK(prl_lltm_forward_cpu(gates, old_cell, h, c, B, S, PRL_FLOAT64) == PRL_SUCCESS);
    for (int b = 0; b < B; ++b)
        for (int s = 0; s < S; ++s) {
            const double *g = gates + b * 3 * S + s;
            const double cand = g[2 * S] > 0 ? g[2 * S] : expm1(g[2 * S]);
            const double cell = old_cell[b * S + s] + cand * sigmoid(g[0]);
            CHECK(fabs(c[b * S + s] - cell) < 1e-12);
            CHECK(fabs(h[b * S + s] - tanh(cell) * sigmoid(g[S])) < 1e-12);
        }

    /* backward against central differences of the forward, for d(sum(new_h + 2 new_cell)) */
    double grad_h[B * S], grad_cell[B * S], d_gates[B * 3 * S], d_cell[B * S];
    for (int i = 0; i < B * S; ++i) { grad_h[i] = 1.0; grad_cell[i] = 2.0; }
    double d_bias[3 * S];
    CHECK(prl_lltm_backward_cpu(grad_h, grad_cell, gates, old_cell, d_gates, d_cell, d_bias, B, S, PRL_FLOAT64) ==
          PRL_SUCCESS);
    for (int j = 0; j < 3 * S; ++j) CHECK(fabs(d_bias[j] - (d_gates[j] + d_gates[3 * S + j])) < 1e-15);
    for (int i = 0; i < B * 3 * S; ++i) {
        double plus = 0, minus = 0, saved = gates[i];
        gates[i] = saved + 1e-6;
        prl_lltm_forward_cpu(gates, old_cell, h, c, B, S, PRL_FLOAT64);
        for (int k = 0; k < B * S; ++k) plus += h[k] + 2 * c[k];
        gates[i] = saved - 1e-6;
        prl_lltm_forward_cpu(gates, old_cell, h, c, B, S, PRL_FLOAT64);
        for (int k = 0; k < B * S; ++k) minus += h[k] + 2 * c[k];
        gates[i] = saved;
        CHECK(fabs((plus - minus) / 2e-6 - d_gates[i]) < 1e-6);
    }
    /* grad_h given as a sum: grad_h + parts[0] + parts[1] (= 1 + 0.25 + -0.5) is the backward of 0.75 */
    double parts[2 * B * S], sum_h[B * S], want_g[B * 3 * S], want_c[B * S];
    for (int i = 0; i < B * S; ++i) { parts[i] = 0.25; parts[B * S + i] = -0.5; sum_h[i] = 0.75; }
    CHECK(prl_lltm_backward_cpu(sum_h, grad_cell, gates, old_cell, want_g, want_c, NULL, B, S, PRL_FLOAT64) ==
          PRL_SUCCESS);
    CHECK(prl_lltm_backward_parts_cpu(grad_h, parts, 2, grad_cell, gates, old_cell, d_gates, d_cell, B, S,
                                      PRL_FLOAT64) == PRL_SUCCESS);
    for (int i = 0; i < B * 3 * S; ++i) CHECK(d_gates[i] == want_g[i]);
    for (int i = 0; i < B * S; ++i) CHECK(d_cell[i] == want_c[i]);
    EXPECT_ERROR(prl_lltm_backward_parts_cpu(grad_h, NULL, 2, grad_cell, gates, old_cell, d_gates, d_cell, B, S,
                                             PRL_FLOAT64), PRL_ERROR_INVALID_ARGUMENT, "'grad_h_parts'");
    EXPECT_ERROR(prl_lltm_backward_parts_cpu(grad_h, parts, 65, grad_cell, gates, old_cell, d_gates, d_cell, B, S,
                                             PRL_FLOAT64), PRL_ERROR_INVALID_ARGUMENT, "'parts'");
    /* NULL gradients mean zero */
    CHECK(prl_lltm_backward_cpu(NULL, NULL, gates, old_cell, d_gates, d_cell, NULL, B, S, PRL_FLOAT64) == PRL_SUCCESS);
    for (int i = 0; i < B * 3 * S; ++i) CHECK(d_gates[i] == 0.0);
    /* an empty batch: the bias gradient is zero */
    for (int j = 0; j < 3 * S; ++j) d_bias[j] = 1.0;
    CHECK(prl_lltm_backward_cpu(NULL, NULL, NULL, NULL, NULL, NULL, d_bias, 0, S, PRL_FLOAT64) == PRL_SUCCESS);
    for (int j = 0; j < 3 * S; ++j) CHECK(d_bias[j] == 0.0);
}

/* The CPU sequence functions against the step functions composed by hand (float64). */
static void test_sequence_cpu(void) {
    enum { T = 3, B = 2, S = 3, LDW = S + 1 };
    double w[3 * S * LDW], h0[B * S], c0[B * S], gates[T * B * 3 * S], want_gates[T * B * 3 * S];
    double out[T * B * S], cells[T * B * S], c_n[B * S], want_h[T * B * S], want_c[T * B * S];
    for (int i = 0; i < 3 * S * LDW; ++i) w[i] = 0.1 * ((i * 7) % 11) - 0.5;
    for (int i = 0; i < B * S; ++i) { h0[i] = 0.3 * (i % 5) - 0.6; c0[i] = 0.2 * (i % 4) - 0.3; }
    for (int i = 0; i < T * B * 3 * S; ++i) gates[i] = want_gates[i] = 0.05 * ((i * 3) % 13) - 0.3;
    for (int t = 0; t < T; ++t) {  /* gates_t += h_{t-1} W_h^T, then the pointwise step */
        const double *h = t ? want_h + (t - 1) * B * S : h0, *c = t ? want_c + (t - 1) * B * S : c0;
        for (int b = 0; b < B; ++b)
            for (int g = 0; g < 3 * S; ++g) {
                double sum = 0;
                for (int k = 0; k < S; ++k) sum += h[b * S + k] * w[g * LDW + k];
                want_gates[(t * B + b) * 3 * S + g] += sum;
            }
        CHECK(prl_lltm_forward_cpu(want_gates + t * B * 3 * S, c, want_h + t * B * S, want_c + t * B * S, B, S,
                                   PRL_FLOAT64) == PRL_SUCCESS);
    }
    CHECK(prl_lltm_sequence_forward_cpu(gates, w, LDW, h0, c0, out, cells, c_n, T, B, S, PRL_FLOAT64) == PRL_SUCCESS);
    for (int i = 0; i < T * B * 3 * S; ++i) CHECK(fabs(gates[i] - want_gates[i]) < 1e-12);
    for (int i = 0; i < T * B * S; ++i) CHECK(fabs(out[i] - want_h[i]) < 1e-12 && fabs(cells[i] - want_c[i]) < 1e-12);
    for (int i = 0; i < B * S; ++i) CHECK(c_n[i] == cells[(T - 1) * B * S + i]);
    /* one step backward: the pointwise backward, d_h0 = d_gates W_h, d_c0 its d_old_cell */
    double grad[B * S], grad_c[B * S], d_gates[B * 3 * S], d_h0[B * S], d_c0[B * S], want_dg[B * 3 * S];
    double want_dc[B * S];
    for (int i = 0; i < B * S; ++i) { grad[i] = 0.1 * i - 0.2; grad_c[i] = 0.05 * i; }
    CHECK(prl_lltm_backward_cpu(grad, grad_c, gates, c0, want_dg, want_dc, NULL, B, S, PRL_FLOAT64) == PRL_SUCCESS);
    CHECK(prl_lltm_sequence_backward_cpu(grad, grad_c, gates, w, LDW, c0, cells, d_gates, d_h0, d_c0, 1, B, S,
                                         PRL_FLOAT64) == PRL_SUCCESS);
    for (int i = 0; i < B * 3 * S; ++i) CHECK(fabs(d_gates[i] - want_dg[i]) < 1e-12);
    for (int b = 0; b < B; ++b)
        for (int k = 0; k < S; ++k) {
            double sum = 0;
            for (int g = 0; g < 3 * S; ++g) sum += want_dg[b * 3 * S + g] * w[g * LDW + k];
            CHECK(fabs(d_h0[b * S + k] - sum) < 1e-12 && fabs(d_c0[b * S + k] - want_dc[b * S + k]) < 1e-12);
        }
    EXPECT_ERROR(prl_lltm_sequence_forward_cpu(gates, w, S - 1, h0, c0, out, cells, NULL, T, B, S, PRL_FLOAT64),
                 PRL_ERROR_INVALID_ARGUMENT, "'ldw'");
    EXPECT_ERROR(prl_lltm_sequence_backward_cpu(grad, NULL, gates, w, LDW, c0, cells, NULL, d_h0, d_c0, 1, B, S,
                                                PRL_FLOAT64), PRL_ERROR_INVALID_ARGUMENT, "'d_gates'");
    EXPECT_ERROR(prl_lltm_sequence_forward_cpu(gates, w, LDW, h0, c0, out, cells, NULL, T, B, S, 9),
                 PRL_ERROR_UNSUPPORTED_DTYPE, "9");
    CHECK(prl_lltm_sequence_forward_cpu(NULL, NULL, S, NULL, NULL, NULL, NULL, NULL, 0, B, S, PRL_FLOAT32) ==
          PRL_SUCCESS);
}

/* A packed batch: sequence 0 runs 3 steps, sequence 1 one (batch_sizes {2, 1, 1}); each is
 * what the unpacked functions give for that sequence alone, c_n and d_c0 at its own last
 * step included; malformed sizes are refused, naming batch_sizes. */
static void test_sequence_packed_cpu(void) {
    enum { T = 3, B = 2, S = 3, LDW = S + 1, N = 4 };
    const int64_t sizes[T] = {2, 1, 1}, growing[T] = {2, 1, 2}, short_first[T] = {1, 1, 1};
    double w[3 * S * LDW], h0[B * S], c0[B * S], gates[N * 3 * S], input_half[N * 3 * S], out[N * S];
    double cells[N * S], c_n[B * S];
    double grad[N * S], grad_c[B * S], d_gates[N * 3 * S], d_h0[B * S], d_c0[B * S];
    for (int i = 0; i < 3 * S * LDW; ++i) w[i] = 0.1 * ((i * 7) % 11) - 0.5;
    for (int i = 0; i < B * S; ++i) { h0[i] = 0.3 * (i % 5) - 0.6; c0[i] = 0.2 * (i % 4) - 0.3; grad_c[i] = 0.1 * i; }
    for (int i = 0; i < N * 3 * S; ++i) gates[i] = input_half[i] = 0.05 * ((i * 3) % 13) - 0.3;
    for (int i = 0; i < N * S; ++i) grad[i] = 0.07 * i - 0.4;
    /* the rows of each sequence alone: sequence 0 at packed rows 0, 2, 3; sequence 1 at row 1 */
    const int rows[B][T] = {{0, 2, 3}, {1, -1, -1}}, steps[B] = {3, 1};
    double one_gates[T * 3 * S], one_out[T * S], one_cells[T * S], one_cn[S], one_grad[T * S];
    double one_dg[T * 3 * S], one_dh0[S], one_dc0[S];
    for (int b = 0; b < B; ++b) {
        for (int t = 0; t < steps[b]; ++t) {
            memcpy(one_gates + t * 3 * S, input_half + rows[b][t] * 3 * S, sizeof(double) * 3 * S);
            memcpy(one_grad + t * S, grad + rows[b][t] * S, sizeof(double) * S);
        }
        CHECK(prl_lltm_sequence_forward_cpu(one_gates, w, LDW, h0 + b * S, c0 + b * S, one_out, one_cells, one_cn,
                                            steps[b], 1, S, PRL_FLOAT64) == PRL_SUCCESS);
        CHECK(prl_lltm_sequence_backward_cpu(one_grad, grad_c + b * S, one_gates, w, LDW, c0 + b * S, one_cells, one_dg,
                                             one_dh0, one_dc0, steps[b], 1, S, PRL_FLOAT64) == PRL_SUCCESS);
        if (b == 0) {  /* the packed calls, once */
            CHECK(prl_lltm_sequence_packed_forward_cpu(gates, w, LDW, h0, c0, out, cells, c_n, sizes, T, B, S,
                                                       PRL_FLOAT64) == PRL_SUCCESS);
            CHECK(prl_lltm_sequence_packed_backward_cpu(grad, grad_c, gates, w, LDW, c0, cells, d_gates, d_h0, d_c0,
                                                        sizes, T, B, S, PRL_FLOAT64) == PRL_SUCCESS);
        }
        for (int t = 0; t < steps[b]; ++t)
            for (int j = 0; j < S; ++j) {
                CHECK(out[rows[b][t] * S + j] == one_out[t * S + j] && cells[rows[b][t] * S + j] == one_cells[t * S + j]);
                for (int g = 0; g < 3; ++g)
                    CHECK(d_gates[rows[b][t] * 3 * S + g * S + j] == one_dg[t * 3 * S + g * S + j]);
            }
        for (int j = 0; j < S; ++j)
            CHECK(c_n[b * S + j] == one_cn[j] && d_h0[b * S + j] == one_dh0[j] && d_c0[b * S + j] == one_dc0[j]);
    }
    EXPECT_ERROR(prl_lltm_sequence_packed_forward_cpu(gates, w, LDW, h0, c0, out, cells, c_n, growing, T, B, S,
                                                      PRL_FLOAT64), PRL_ERROR_INVALID_ARGUMENT, "'batch_sizes'");
    EXPECT_ERROR(prl_lltm_sequence_packed_backward_cpu(grad, grad_c, gates, w, LDW, c0, cells, d_gates, d_h0, d_c0,
                                                       short_first, T, B, S, PRL_FLOAT64),
                 PRL_ERROR_INVALID_ARGUMENT, "'batch_sizes'");
}

/* The input half: gates[r] = input[r] @ W_x^T + bias (W_x: the last columns of weights, a
 * NULL bias none), against sums written out here; bad sizes and pointers are refused. */
static void test_input_half_cpu(void) {
    enum { R = 7, I = 3, S = 2, LDW = S + I };
    double x[R * I], w[3 * S * LDW], b[3 * S], gates[R * 3 * S], no_bias[R * 3 * S];
    for (int i = 0; i < R * I; ++i) x[i] = 0.1 * ((i * 5) % 9) - 0.4;
    for (int i = 0; i < 3 * S * LDW; ++i) w[i] = 0.1 * ((i * 7) % 11) - 0.5;
    for (int i = 0; i < 3 * S; ++i) b[i] = 0.25 * i - 0.5;
    CHECK(prl_lltm_input_half_cpu(x, w, b, gates, R, I, S, PRL_FLOAT64) == PRL_SUCCESS);
    CHECK(prl_lltm_input_half_cpu(x, w, NULL, no_bias, R, I, S, PRL_FLOAT64) == PRL_SUCCESS);
    for (int r = 0; r < R; ++r)
        for (int g = 0; g < 3 * S; ++g) {
            double sum = 0;
            for (int i = 0; i < I; ++i) sum += x[r * I + i] * w[g * LDW + S + i];
            CHECK(fabs(no_bias[r * 3 * S + g] - sum) < 1e-12 && fabs(gates[r * 3 * S + g] - sum - b[g]) < 1e-12);
        }
    EXPECT_ERROR(prl_lltm_input_half_cpu(x, w, b, gates, -1, I, S, PRL_FLOAT64), PRL_ERROR_INVALID_ARGUMENT, "'rows'");
    EXPECT_ERROR(prl_lltm_input_half_cpu(NULL, w, b, gates, R, I, S, PRL_FLOAT64), PRL_ERROR_INVALID_ARGUMENT,
                 "'input'");
    EXPECT_ERROR(prl_lltm_input_half_cpu(x, w, b, gates, R, I, S, 9), PRL_ERROR_UNSUPPORTED_DTYPE, "9");
    CHECK(prl_lltm_input_half_cpu(NULL, NULL, NULL, NULL, 0, I, S, PRL_FLOAT32) == PRL_SUCCESS);
}

static void test_matmul_cpu(void) {
    enum { M = 7, N = 5, K = 4, LDA = K + 1, LDAT = M + 2, LDB = N + 3, LDC = N + 1 };
    double a[M * LDA], at[K * LDAT], b[K * LDB], c[M * LDC], ct[M * LDC];
    for (int i = 0; i < M * LDA; ++i) a[i] = 0.1 * ((i * 5) % 9) - 0.4;
    for (int i = 0; i < K * LDAT; ++i) at[i] = 0.1 * ((i * 3) % 7) - 0.3;
    for (int i = 0; i < K * LDB; ++i) b[i] = 0.1 * ((i * 7) % 11) - 0.5;
    for (int i = 0; i < M * LDC; ++i) c[i] = ct[i] = -99.0;
    CHECK(prl_matmul_cpu(a, LDA, 0, b, LDB, c, LDC, M, N, K, PRL_FLOAT64) == PRL_SUCCESS);
    CHECK(prl_matmul_cpu(at, LDAT, 1, b, LDB, ct, LDC, M, N, K, PRL_FLOAT64) == PRL_SUCCESS);
    for (int r = 0; r < M; ++r) {
        for (int j = 0; j < N; ++j) {
            double sum = 0, sum_t = 0;
            for (int i = 0; i < K; ++i) {
                sum += a[r * LDA + i] * b[i * LDB + j];
                sum_t += at[i * LDAT + r] * b[i * LDB + j];
            }
            CHECK(fabs(c[r * LDC + j] - sum) < 1e-12 && fabs(ct[r * LDC + j] - sum_t) < 1e-12);
        }
        CHECK(c[r * LDC + N] == -99.0 && ct[r * LDC + N] == -99.0); /* past the row: untouched */
    }
    EXPECT_ERROR(prl_matmul_cpu(a, LDA, 2, b, LDB, c, LDC, M, N, K, PRL_FLOAT64), PRL_ERROR_INVALID_ARGUMENT,
                 "'transpose_a'");
    EXPECT_ERROR(prl_matmul_cpu(a, 2, 0, b, LDB, c, LDC, M, N, K, PRL_FLOAT64), PRL_ERROR_INVALID_ARGUMENT, "lda=2");
    EXPECT_ERROR(prl_matmul_cpu(a, LDA, 0, b, LDB, NULL, LDC, M, N, K, PRL_FLOAT64), PRL_ERROR_INVALID_ARGUMENT, "'c'");
    EXPECT_ERROR(prl_matmul_cpu(a, LDA, 0, b, LDB, c, LDC, M, N, K, 9), PRL_ERROR_UNSUPPORTED_DTYPE, "9");
}

/* The sequence functions split the batch among prl_set_cpu_threads() threads, run by the
 * library's workers or by a prl_set_cpu_parallel runner; every output is bit-for-bit the
 * one-thread result (each row's recurrence is computed the same way whichever thread runs
 * it).  Sizes large enough that the work is split. */
enum { TT = 4, TB = 10, TS = 128 };
static double t_w[3 * TS * TS], t_h0[TB * TS], t_c0[TB * TS], t_grad[TT * TB * TS];
enum { RUNS = 4 };
static double t_gates[RUNS][TT * TB * 3 * TS], t_out[RUNS][TT * TB * TS], t_cells[RUNS][TT * TB * TS];
static double t_cn[RUNS][TB * TS], t_dg[RUNS][TT * TB * 3 * TS], t_dh0[RUNS][TB * TS], t_dc0[RUNS][TB * TS];

/* A runner keeping prl_parallel_fn's contract on one thread: its "threads" run one after
 * the other, the last first; serial_number gives the one running its number in the team. */
static unsigned runner_calls, runner_threads;
static int serial_current;
static void serial_runner(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags) {
    ++runner_calls;
    runner_threads = num_threads;
    CHECK(flags == 0);
    for (unsigned i = num_threads; i-- > 0;) {
        serial_current = (int)i;
        fn(data);
    }
    serial_current = 0;
}
static int serial_number(void) { return serial_current; }

static void test_cpu_threads(void) {
    CHECK(prl_cpu_threads() == 1);  /* until set */
    EXPECT_ERROR(prl_set_cpu_threads(0), PRL_ERROR_INVALID_ARGUMENT, "'threads' must be >= 1, got 0");
    unsigned seed = 12345;
#define NEXT() ((seed = seed * 1103515245u + 12345u) >> 8 & 0xffff) / 65536.0 - 0.5
    for (int i = 0; i < 3 * TS * TS; ++i) t_w[i] = (NEXT()) * 0.2;
    for (int i = 0; i < TB * TS; ++i) { t_h0[i] = NEXT(); t_c0[i] = NEXT(); }
    for (int i = 0; i < TT * TB * TS; ++i) t_grad[i] = NEXT();
    for (int i = 0; i < TT * TB * 3 * TS; ++i) {
        t_gates[0][i] = NEXT();
        for (int run = 1; run < RUNS; ++run) t_gates[run][i] = t_gates[0][i];
    }
#undef NEXT
    for (int run = 0; run < RUNS; ++run) {  /* 1 thread; 4 of the library's; 4 of serial_runner's, numbered or not */
        CHECK(prl_set_cpu_threads(run ? 4 : 1) == PRL_SUCCESS && prl_cpu_threads() == (run ? 4 : 1));
        CHECK(prl_set_cpu_parallel(run >= 2 ? serial_runner : NULL) == PRL_SUCCESS);
        CHECK(prl_set_cpu_thread_num(run == 3 ? serial_number : NULL) == PRL_SUCCESS);
        CHECK(prl_lltm_sequence_forward_cpu(t_gates[run], t_w, TS, t_h0, t_c0, t_out[run], t_cells[run], t_cn[run],
                                            TT, TB, TS, PRL_FLOAT64) == PRL_SUCCESS);
        CHECK(prl_lltm_sequence_backward_cpu(t_grad, t_cn[run], t_gates[run], t_w, TS, t_c0, t_cells[run], t_dg[run],
                                             t_dh0[run], t_dc0[run], TT, TB, TS, PRL_FLOAT64) == PRL_SUCCESS);
    }
    /* forward and backward, each a region for W_h's pack and one for the loop, prl_cpu_threads() each */
    CHECK(runner_calls == 8 && runner_threads == 4);
    for (int run = 1; run < RUNS; ++run) {
        CHECK(memcmp(t_gates[0], t_gates[run], sizeof t_gates[0]) == 0);
        CHECK(memcmp(t_out[0], t_out[run], sizeof t_out[0]) == 0 && memcmp(t_cn[0], t_cn[run], sizeof t_cn[0]) == 0);
        CHECK(memcmp(t_cells[0], t_cells[run], sizeof t_cells[0]) == 0);
        CHECK(memcmp(t_dg[0], t_dg[run], sizeof t_dg[0]) == 0 && memcmp(t_dh0[0], t_dh0[run], sizeof t_dh0[0]) == 0);
        CHECK(memcmp(t_dc0[0], t_dc0[run], sizeof t_dc0[0]) == 0);
        CHECK(t_out[run][TT * TB * TS - 1] != 0.0 && t_dh0[run][TB * TS - 1] != 0.0);  /* the last rows written */
    }
    CHECK(prl_set_cpu_threads(1) == PRL_SUCCESS && prl_set_cpu_parallel(NULL) == PRL_SUCCESS);
    CHECK(prl_set_cpu_thread_num(NULL) == PRL_SUCCESS);
}

static void test_errors(void) {
    float x[4] = {0}, y[4];
    EXPECT_ERROR(prl_round_cpu(NULL, y, 4, PRL_FLOAT32), PRL_ERROR_INVALID_ARGUMENT, "'x'");
    EXPECT_ERROR(prl_round_cpu(x, NULL, 4, PRL_FLOAT32), PRL_ERROR_INVALID_ARGUMENT, "'y'");
    EXPECT_ERROR(prl_round_cpu(x, y, -1, PRL_FLOAT32), PRL_ERROR_INVALID_ARGUMENT, "'n'");
    EXPECT_ERROR(prl_round_cpu(x, y, 4, 99), PRL_ERROR_UNSUPPORTED_DTYPE, "'dtype' is 99");
    EXPECT_ERROR(prl_round_cpu(x, y, 4, -7), PRL_ERROR_UNSUPPORTED_DTYPE, "'dtype' is -7");
    CHECK(prl_round_cpu(NULL, NULL, 0, PRL_FLOAT32) == PRL_SUCCESS); /* nothing to do */
    EXPECT_ERROR(prl_lltm_forward_cpu(x, NULL, y, y, 1, 1, PRL_FLOAT32), PRL_ERROR_INVALID_ARGUMENT, "'old_cell'");
    EXPECT_ERROR(prl_lltm_forward_cpu(x, x, y, y, -2, 1, PRL_FLOAT32), PRL_ERROR_INVALID_ARGUMENT, "'batch'");
    EXPECT_ERROR(prl_lltm_forward_cpu(x, x, y, y, 1, -3, PRL_FLOAT32), PRL_ERROR_INVALID_ARGUMENT, "'state'");
    EXPECT_ERROR(prl_lltm_forward_cpu(x, x, y, y, INT64_MAX / 2, INT64_MAX / 2, PRL_FLOAT32),
                 PRL_ERROR_INVALID_ARGUMENT, "more elements than any buffer");
    EXPECT_ERROR(prl_lltm_forward_cpu(x, x, y, y, INT64_MAX / 3, 2, PRL_FLOAT32), PRL_ERROR_INVALID_ARGUMENT,
                 "more elements than any buffer");
    EXPECT_ERROR(prl_lltm_backward_cpu(NULL, NULL, x, x, y, y, NULL, 1, INT64_MAX, PRL_FLOAT64),
                 PRL_ERROR_INVALID_ARGUMENT, "batch=1");
    EXPECT_ERROR(prl_lltm_backward_cpu(NULL, NULL, NULL, NULL, NULL, NULL, y, 0, INT64_MAX / 3, PRL_FLOAT32),
                 PRL_ERROR_INVALID_ARGUMENT, "d_bias");
    EXPECT_ERROR(prl_round_cpu(x, y, INT64_MAX, PRL_FLOAT32), PRL_ERROR_INVALID_ARGUMENT, "more elements");
    EXPECT_ERROR(prl_round_cpu(x, y, INT64_MIN, PRL_FLOAT32), PRL_ERROR_INVALID_ARGUMENT, "'n' must be >= 0");
    EXPECT_ERROR(prl_round_cpu(NULL, NULL, INT64_MAX / 8, PRL_FLOAT64), PRL_ERROR_INVALID_ARGUMENT, "'x' is NULL");
    EXPECT_ERROR(prl_round_cpu(x, y, 1, INT32_MAX), PRL_ERROR_UNSUPPORTED_DTYPE, "2147483647");
    EXPECT_ERROR(prl_round_cpu(x, y, 1, INT32_MIN), PRL_ERROR_UNSUPPORTED_DTYPE, "-2147483648");
    /* n = 0 and batch or state = 0: nothing to do, any pointers */
    CHECK(prl_lltm_forward_cpu(NULL, NULL, NULL, NULL, 0, 7, PRL_BFLOAT16) == PRL_SUCCESS);
    CHECK(prl_lltm_backward_cpu(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 3, 0, PRL_FLOAT16) == PRL_SUCCESS);
    /* a failure leaves its message; a later success does not clear it, a later failure replaces it */
    EXPECT_ERROR(prl_round_cpu(x, y, -5, PRL_FLOAT32), PRL_ERROR_INVALID_ARGUMENT, "-5");
    CHECK(prl_round_cpu(x, y, 4, PRL_FLOAT32) == PRL_SUCCESS);
    CHECK(strstr(prl_last_error(), "-5") != NULL);
    for (int s = -3; s < 10; ++s) CHECK(prl_status_string(s) != NULL && prl_status_string(s)[0] != '\0');
    EXPECT_ERROR(prl_lltm_backward_cpu(NULL, NULL, x, x, NULL, y, NULL, 1, 1, PRL_FLOAT32), PRL_ERROR_INVALID_ARGUMENT,
                 "'d_gates'");
    EXPECT_ERROR(prl_lltm_backward_cpu(NULL, NULL, x, x, y, y, NULL, 1, 1, 4), PRL_ERROR_UNSUPPORTED_DTYPE, "dtype");

    /* CUDA entry points: argument checks first, then either a CPU-only build's status or success for n = 0
     * (no CUDA call is made for n = 0, so this needs no GPU). */
    if (prl_has_cuda()) {
        EXPECT_ERROR(prl_round_cuda(NULL, y, 4, PRL_FLOAT32, -1, NULL), PRL_ERROR_INVALID_ARGUMENT, "'x'");
        EXPECT_ERROR(prl_round_cuda(x, y, -1, PRL_FLOAT32, 0, NULL), PRL_ERROR_INVALID_ARGUMENT, "'n'");
        EXPECT_ERROR(prl_round_cuda(x, y, INT64_MAX, PRL_FLOAT32, 0, NULL), PRL_ERROR_INVALID_ARGUMENT, "more elements");
        EXPECT_ERROR(prl_lltm_forward_cuda(x, x, y, y, INT64_MAX, INT64_MAX, PRL_FLOAT32, 0, NULL),
                     PRL_ERROR_INVALID_ARGUMENT, "more elements");
        EXPECT_ERROR(prl_round_cuda(x, y, 4, 42, -1, NULL), PRL_ERROR_UNSUPPORTED_DTYPE, "42");
        CHECK(prl_round_cuda(NULL, NULL, 0, PRL_FLOAT32, -1, NULL) == PRL_SUCCESS);
        CHECK(prl_lltm_forward_cuda(NULL, NULL, NULL, NULL, 0, 5, PRL_FLOAT16, -1, NULL) == PRL_SUCCESS);
        EXPECT_ERROR(prl_lltm_backward_cuda(NULL, NULL, x, x, y, NULL, NULL, 1, 1, PRL_FLOAT32, -1, NULL),
                     PRL_ERROR_INVALID_ARGUMENT, "'d_old_cell'");
        EXPECT_ERROR(prl_lltm_backward_parts_cuda(NULL, NULL, -1, NULL, x, x, y, y, 1, 1, PRL_FLOAT32, -1, NULL),
                     PRL_ERROR_INVALID_ARGUMENT, "'parts'");
        CHECK(prl_lltm_backward_parts_cuda(NULL, NULL, 3, NULL, NULL, NULL, NULL, NULL, 0, 5, PRL_FLOAT16, -1, NULL) ==
              PRL_SUCCESS);
        EXPECT_ERROR(prl_lltm_sequence_cuda_fits(1, 1, PRL_FLOAT32, -1, NULL), PRL_ERROR_INVALID_ARGUMENT, "'fits'");
        EXPECT_ERROR(prl_lltm_sequence_forward_cuda(x, x, 0, x, x, y, y, y, 2, 1, 1, PRL_FLOAT32, -1, NULL),
                     PRL_ERROR_INVALID_ARGUMENT, "'ldw'");
        EXPECT_ERROR(prl_lltm_sequence_forward_cuda(x, x, 1, x, x, NULL, y, NULL, 2, 1, 1, PRL_FLOAT32, -1, NULL),
                     PRL_ERROR_INVALID_ARGUMENT, "'output'");
        EXPECT_ERROR(prl_lltm_sequence_backward_cuda(x, NULL, x, x, 1, x, x, y, y, y, -3, 1, 1, PRL_FLOAT32, -1, NULL),
                     PRL_ERROR_INVALID_ARGUMENT, "'steps'");
        EXPECT_ERROR(prl_lltm_sequence_backward_cuda(x, NULL, x, x, 1, x, x, y, y, y, 2, 1, 1, 42, -1, NULL),
                     PRL_ERROR_UNSUPPORTED_DTYPE, "42");
        CHECK(prl_lltm_sequence_forward_cuda(NULL, NULL, 4, NULL, NULL, NULL, NULL, NULL, 0, 3, 4, PRL_FLOAT32, -1, NULL) ==
              PRL_SUCCESS);
    } else {
        int fits = 1;
        EXPECT_ERROR(prl_lltm_sequence_cuda_fits(1, 1, PRL_FLOAT32, 0, &fits), PRL_ERROR_CUDA_NOT_COMPILED,
                     "prl_lltm_sequence_cuda_fits");
        CHECK(fits == 0);
        EXPECT_ERROR(prl_lltm_sequence_forward_cuda(x, x, 1, x, x, y, y, y, 1, 1, 1, PRL_FLOAT32, 0, NULL),
                     PRL_ERROR_CUDA_NOT_COMPILED, "prl_lltm_sequence_forward_cuda");
        EXPECT_ERROR(prl_lltm_sequence_backward_cuda(x, x, x, x, 1, x, x, y, y, y, 1, 1, 1, PRL_FLOAT32, 0, NULL),
                     PRL_ERROR_CUDA_NOT_COMPILED, "prl_lltm_sequence_backward_cuda");
        EXPECT_ERROR(prl_round_cuda(x, y, 4, PRL_FLOAT32, 0, NULL), PRL_ERROR_CUDA_NOT_COMPILED, "without CUDA");
        EXPECT_ERROR(prl_lltm_forward_cuda(x, x, y, y, 1, 1, PRL_FLOAT32, 0, NULL), PRL_ERROR_CUDA_NOT_COMPILED,
                     "prl_lltm_forward_cuda");
        EXPECT_ERROR(prl_lltm_backward_cuda(x, x, x, x, y, y, NULL, 1, 1, PRL_FLOAT32, 0, NULL),
                     PRL_ERROR_CUDA_NOT_COMPILED, "prl_lltm_backward_cuda");
        EXPECT_ERROR(prl_lltm_backward_parts_cuda(x, NULL, 0, x, x, x, y, y, 1, 1, PRL_FLOAT32, 0, NULL),
                     PRL_ERROR_CUDA_NOT_COMPILED, "prl_lltm_backward_parts_cuda");
    }
}

/* Each group's end is printed as it happens (stdout unbuffered): a run that stops early
 * shows where, and one that never printed "started" was never run (make windows tells the
 * two apart under Wine). */
#define RUN(test) (test(), printf("abi_test: %s done\n", #test))

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    printf("abi_test: started\n");
    RUN(test_info);
    RUN(test_round_cpu);
    RUN(test_lltm_cpu);
    RUN(test_sequence_cpu);
    RUN(test_sequence_packed_cpu);
    RUN(test_input_half_cpu);
    RUN(test_matmul_cpu);
    RUN(test_cpu_threads);
    RUN(test_errors);
    if (failures) {
        fprintf(stderr, "abi_test: %d check(s) failed\n", failures);
        return 1;
    }
    printf("abi_test: all checks passed (ABI %d, CUDA %s)\n", prl_abi_version(), prl_has_cuda() ? "yes" : "no");
    return 0;
}
