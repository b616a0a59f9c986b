// lltm_sequence_cpu.cpp - the LLTM's recurrence over a whole sequence on the CPU, one call
// per direction: prl_lltm_sequence_forward_cpu, prl_lltm_sequence_backward_cpu.
//
// The same contract as the persistent CUDA kernels (lltm_sequence_cuda.cu): the caller
// forms the input half of the gates for all steps at once; here every step's recurrent
// product and pointwise cell run in one native loop, so a short sequence pays no Python,
// dispatcher or ctypes overhead per step.  Per step:
//   - the left operand (h_{t-1}, or d_gates[t + 1] backward) in an arithmetic-type buffer
//     whose row count is a multiple of the register tile;
//   - one register-tiled product with W_h, packed once per call in column panels (forward:
//     W_h^T, [S, 3S]; backward: W_h, [3S, S]), columns padded to the panel width with zeros;
//   - the pointwise cell of lltm.h, storing in the tensor's dtype wherever the step-by-step
//     path stores (the pre-activations, new_h, new_cell, the gradient reaching h_t), so both
//     paths round alike.
// How the work is split among up to prl_cpu_threads() threads (Plan, below):
//   - by rows, each part running the whole sequence for its rows with no synchronisation
//     (row b of a step reads only row b of the step before), where the batch has enough
//     rows for the threads;
//   - else step by step: each part a range of rows and of state columns, its product with the
//     columns of W_h its three gates need, then those cells (the grid), or, where a BLAS was
//     handed over (prl_set_cpu_gemm), for short sequences one BLAS call a step threaded by the
//     BLAS, then the cells by rows.
// Each element is computed by the same tile code in the same order however the work is
// split, so every result is bit for bit the same at any thread count (with a BLAS, as far as
// its own results are: MKL's agree at 1-5 threads, not at 16 on a 16-core Xeon).
//
// A packed batch (prl_lltm_sequence_packed_*_cpu: a PackedSequence's data, sequences sorted
// longest first) runs the same loops over `Rows`: step t's rows are the first sizes[t] of
// the batch, stored after those of the steps before it, and every row runs exactly its own
// steps.  A row's state carries from step to step as in a padded batch (row b of a step
// reads row b of the step before, which a sorted pack always has); the rows that end at a
// step leave their last new_cell in c_n, and a row enters the backward at its own last
// step, with its grad_c_n and no gradient from a later step.
#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "cpu_gemm.h"
#include "cpu_threads.h"
#include "lltm.h"

// Whether the loops below ask the CPU which instructions it has: x86 builds whose loops are
// built for several instruction sets (PRL_CPU_MULTIVERSION: common.h).
#if defined(PRL_CPU_MULTIVERSION) && (defined(__x86_64__) || defined(__i386__))
#define PRL_X86_CPU_QUERIES 1
#else
#define PRL_X86_CPU_QUERIES 0
#endif

namespace {

// The register tile: R rows x kCols columns of accumulators (kCols: 32 floats, 16 doubles).
// R = 6 where the AVX-512 loops run (12 of its 32 vector registers), 3 elsewhere (12 of
// AVX2's 16; 6 rows would spill).  Measured on the development VM (AMD EPYC, AVX-512), the
// forward loop at (T, B, S) = (50, 64, 128): 117-130 GFLOP/s with 6 rows, 72-94 with 3.
template <typename A> constexpr int64_t kCols = 128 / (int64_t)sizeof(A);

int64_t tile_rows() {
#if PRL_X86_CPU_QUERIES
    static const int64_t rows = __builtin_cpu_supports("avx512f") ? 6 : 3;
    return rows;
#else
    return 3;
#endif
}

// Every multiply-add of the products rounds the same way in every register tile, so that a
// row computes the same whichever tile shape the thread split gives it: fused (one FMA, one
// rounding) where the x86-64-v3 or v4 loops run, else a multiply then an add.  Left to the
// compiler, GCC fused the multiply-adds of some tile shapes and not of others (AVX2: the
// float64 forward at (T, B, S) = (4, 10, 128) differed in the last bit between one thread and
// four), so this file is built with -ffp-contract=off and the fused loops ask for FMAs.
bool fused_products() {
#if PRL_X86_CPU_QUERIES
    static const bool yes = __builtin_cpu_supports("x86-64-v3");
    return yes;
#else
    return false;
#endif
}

template <bool Fused> PRL_HD float madd(float x, float w, float acc) {
    if constexpr (Fused) return __builtin_fmaf(x, w, acc);
    return acc + x * w;
}
template <bool Fused> PRL_HD double madd(double x, double w, double acc) {
    if constexpr (Fused) return __builtin_fma(x, w, acc);
    return acc + x * w;
}

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// c[r][j] = sum_i a[r][i] w[i][j] for the rows [r_begin, r_end) (multiples of R) and the
// columns [c_begin, c_end) (multiples of kCols); a has k columns, c row stride ldc.  w is
// packed in column panels (pack_panels): kCols columns at a time, each panel k x kCols
// contiguous, swept by every row tile while it is in L1 (panels outer, rows inner) and read
// front to back.  The fixed-size inner loops keep the tile in registers; GCC vectorises the
// column loop.  Each element is one sum over i in order, whichever tile and range it is in.
template <typename A, int R, int CP, bool Fused>
PRL_CPU_CLONES void product_tiles(const A *__restrict a, int64_t k, const A *__restrict w, A *__restrict c,
                                  int64_t ldc, int64_t r_begin, int64_t r_end, int64_t c_begin, int64_t c_end) {
    constexpr int64_t NC = kCols<A>;
    for (int64_t c0 = c_begin; c0 + CP * NC <= c_end; c0 += CP * NC) {  // CP panels at a time
        const A *__restrict panel = w + c0 * k;
        for (int64_t r0 = r_begin; r0 < r_end; r0 += R) {
            A acc[R][CP * NC] = {};
            for (int64_t i = 0; i < k; ++i)
                for (int p = 0; p < CP; ++p) {
                    const A *__restrict w_row = panel + p * NC * k + i * NC;
                    for (int r = 0; r < R; ++r) {
                        const A x = a[(r0 + r) * k + i];
                        for (int64_t q = 0; q < NC; ++q)
                            acc[r][p * NC + q] = madd<Fused>(x, w_row[q], acc[r][p * NC + q]);
                    }
                }
            for (int r = 0; r < R; ++r)
                for (int64_t q = 0; q < CP * NC; ++q) c[(r0 + r) * ldc + c0 + q] = acc[r][q];
        }
    }
}

template <typename A, int R, int CP = 1>
void tiles(const A *a, int64_t k, const A *w, A *c, int64_t ldc, int64_t r_begin, int64_t r_end, int64_t c_begin,
           int64_t c_end) {
#if PRL_X86_CPU_QUERIES
    if (fused_products()) return product_tiles<A, R, CP, true>(a, k, w, c, ldc, r_begin, r_end, c_begin, c_end);
#endif
    product_tiles<A, R, CP, false>(a, k, w, c, ldc, r_begin, r_end, c_begin, c_end);
}

// c = a @ w over the rows [r_begin, r_end) and the columns [c_begin, c_end): whole tiles of
// rows_per_tile rows, then the rows left over as one narrower tile, so that no padding row is
// computed (a batch of 2 in 6-row tiles took 1.5x the time of exact rows at (T, B, I, S) =
// (50, 2, 64, 512), a batch of 4 1.12-1.16x at (30, 4, 256, 256), on the development VM:
// benchmarks/NOTES.md).
// A tile of one or two rows sweeps several panels at a time (rows x panels = 4 where the
// AVX-512 loops run, else 2), so that 8 vector registers of accumulators hide the
// multiply-adds' latency (one row of one panel keeps only 2); the panels left over one at a
// time.
template <typename A, int R>
void narrow_tiles(const A *a, int64_t k, const A *w, A *c, int64_t ldc, int64_t r_begin, int64_t r_end,
                  int64_t c_begin, int64_t c_end) {
    constexpr int64_t NC = kCols<A>;
    const int64_t wide = (tile_rows() == 6 ? 4 : 2) / R;
    const int64_t whole = c_begin + (c_end - c_begin) / (wide * NC) * (wide * NC);
    if (wide == 4)
        tiles<A, R, 4>(a, k, w, c, ldc, r_begin, r_end, c_begin, whole);
    else if (wide == 2)
        tiles<A, R, 2>(a, k, w, c, ldc, r_begin, r_end, c_begin, whole);
    else
        tiles<A, R, 1>(a, k, w, c, ldc, r_begin, r_end, c_begin, whole);
    tiles<A, R>(a, k, w, c, ldc, r_begin, r_end, whole, c_end);
}

template <typename A>
void product(int64_t rows_per_tile, const A *a, int64_t k, const A *w, A *c, int64_t ldc, int64_t r_begin,
             int64_t r_end, int64_t c_begin, int64_t c_end) {
    const int64_t whole = r_begin + (r_end - r_begin) / rows_per_tile * rows_per_tile;
    if (rows_per_tile == 6)
        tiles<A, 6>(a, k, w, c, ldc, r_begin, whole, c_begin, c_end);
    else if (rows_per_tile == 3)
        tiles<A, 3>(a, k, w, c, ldc, r_begin, whole, c_begin, c_end);
    else
        narrow_tiles<A, 1>(a, k, w, c, ldc, r_begin, whole, c_begin, c_end);
    switch (r_end - whole) {  // the rows left over: fewer than rows_per_tile
        case 0: break;
        case 1: narrow_tiles<A, 1>(a, k, w, c, ldc, whole, r_end, c_begin, c_end); break;
        case 2: narrow_tiles<A, 2>(a, k, w, c, ldc, whole, r_end, c_begin, c_end); break;
        case 3: tiles<A, 3>(a, k, w, c, ldc, whole, r_end, c_begin, c_end); break;
        case 4: tiles<A, 4>(a, k, w, c, ldc, whole, r_end, c_begin, c_end); break;
        default: tiles<A, 5>(a, k, w, c, ldc, whole, r_end, c_begin, c_end); break;
    }
}

// A matrix packed in panels for `product`: its buffer, left uninitialised until pack's parts
// write it.
template <typename A> class Panels {
  public:
    explicit Panels(int64_t size) : data_(new A[(size_t)size]) {}
    A *data() { return data_.get(); }
    const A *data() const { return data_.get(); }

  private:
    std::unique_ptr<A[]> data_;
};

// w for `product`: a k x cols matrix, zero columns up to n (a multiple of kCols), in panels of
// kCols columns, each k x kCols contiguous; from kGrain elements on, the panels split among all
// the threads, each part zeroing and filling its own.  On a 16-core Xeon, against the buffer
// zeroed by the calling thread and parts of at least kGrain elements (6 parts for W_h at
// S = 256), the sequence loops took 0.82 / 0.85x the time (inference / fwd+bwd) at (T, B, I, S) =
// (30, 4, 256, 256), 0.90 / 0.92x at (100, 1, 256, 256), 0.93-1.02x elsewhere
// (benchmarks/NOTES.md).  fill(panel, c0) writes the panel of columns [c0, c0 + kCols) (of them,
// those below cols).
template <typename A, typename Fill> Panels<A> pack(int64_t k, int64_t n, Fill &&fill) {
    constexpr int64_t NC = kCols<A>;
    Panels<A> w(k * n);
    const int64_t panels = n / NC, parts = k * n < prl::kGrain ? 1 : std::min(panels, prl::cpu_threads());
    prl::run_parts(parts, [&](int64_t p) {
        const int64_t begin = p * panels / parts * NC, end = (p + 1) * panels / parts * NC;
        std::fill(w.data() + begin * k, w.data() + end * k, A(0));
        for (int64_t c0 = begin; c0 < end; c0 += NC) fill(w.data() + c0 * k, c0);
    });
    return w;
}

// The panels of the k x cols matrix src[i * ld + j] (W_h, the backward's).
template <typename A, typename T>
Panels<A> pack_panels(const T *src, int64_t ld, int64_t k, int64_t cols, int64_t n) {
    constexpr int64_t NC = kCols<A>;
    return pack<A>(k, n, [&](A *panel, int64_t c0) {
        const int64_t width = std::min(NC, cols - c0);
        for (int64_t i = 0; i < k; ++i)
            for (int64_t q = 0; q < width; ++q) panel[i * NC + q] = prl::load(src[i * ld + c0 + q]);
    });
}

#if defined(PRL_CPU_MULTIVERSION)
// out[i * ld_out + q] = src[q * ld + i] for q, i < 8, in float: an 8 x 8 block transposed in
// AVX2 registers (three rounds of shuffles of row pairs), where GCC's code for the plain
// loops moves an element at a time.
typedef float prl_v8 __attribute__((vector_size(32)));
typedef int prl_i8 __attribute__((vector_size(32)));
template <typename T>
__attribute__((target("avx2"))) void transpose_8x8(const T *src, int64_t ld, float *out, int64_t ld_out) {
    prl_v8 r[8], t[8], u[8];
    for (int q = 0; q < 8; ++q)
        for (int i = 0; i < 8; ++i) r[q][i] = prl::load(src[q * ld + i]);
    for (int q = 0; q < 8; q += 2) {  // t[q], t[q + 1]: rows q and q + 1 interleaved, low and high pairs
        t[q] = __builtin_shuffle(r[q], r[q + 1], prl_i8{0, 8, 1, 9, 4, 12, 5, 13});
        t[q + 1] = __builtin_shuffle(r[q], r[q + 1], prl_i8{2, 10, 3, 11, 6, 14, 7, 15});
    }
    for (int h = 0; h < 8; h += 4) {  // u[h + j]: columns j and j + 4 of rows h..h+3
        u[h] = __builtin_shuffle(t[h], t[h + 2], prl_i8{0, 1, 8, 9, 4, 5, 12, 13});
        u[h + 1] = __builtin_shuffle(t[h], t[h + 2], prl_i8{2, 3, 10, 11, 6, 7, 14, 15});
        u[h + 2] = __builtin_shuffle(t[h + 1], t[h + 3], prl_i8{0, 1, 8, 9, 4, 5, 12, 13});
        u[h + 3] = __builtin_shuffle(t[h + 1], t[h + 3], prl_i8{2, 3, 10, 11, 6, 7, 14, 15});
    }
    for (int j = 0; j < 4; ++j) {  // column j, then column j + 4, of all 8 rows
        const prl_v8 low = __builtin_shuffle(u[j], u[4 + j], prl_i8{0, 1, 2, 3, 8, 9, 10, 11});
        const prl_v8 high = __builtin_shuffle(u[j], u[4 + j], prl_i8{4, 5, 6, 7, 12, 13, 14, 15});
        std::memcpy(out + j * ld_out, &low, sizeof low);
        std::memcpy(out + (j + 4) * ld_out, &high, sizeof high);
    }
}
bool transpose_in_registers() {
    static const bool avx2 = __builtin_cpu_supports("avx2");
    return avx2;
}
#endif

// The same panels of the k x cols matrix src[j * ld + i] (W_h^T, the forward's; W_x^T, the
// input half's): a column is a row of src, contiguous.  float panels in 8 x 8 blocks
// transposed in registers where the AVX2 loops run (0.54x the time of the plain loops at
// S = 256, 3S x S: 49 against 91 us on the development VM, one thread); the rest, and other
// types, read a row of src at a time (the other way round, W_h^T of a 256-state layer took
// 0.4 ms against 0.1 ms there).
template <typename A, typename T>
Panels<A> pack_panels_transposed(const T *src, int64_t ld, int64_t k, int64_t cols, int64_t n) {
    constexpr int64_t NC = kCols<A>;
    return pack<A>(k, n, [&](A *panel, int64_t c0) {
        const int64_t width = std::min(NC, cols - c0);
        int64_t blocked = 0;  // the first rows of the panel, written in 8 x 8 blocks
#if defined(PRL_CPU_MULTIVERSION)
        if constexpr (std::is_same_v<A, float>) {
            if (width == NC && transpose_in_registers())
                for (; blocked + 8 <= k; blocked += 8)
                    for (int64_t q0 = 0; q0 < NC; q0 += 8)
                        transpose_8x8(src + (c0 + q0) * ld + blocked, ld, panel + blocked * NC + q0, NC);
        }
#endif
        for (int64_t q = 0; q < width; ++q)
            for (int64_t i = blocked; i < k; ++i) panel[i * NC + q] = prl::load(src[(c0 + q) * ld + i]);
    });
}

// dst[i] = src[i] in the arithmetic type, for i < count.
template <typename T, typename A> void to_arithmetic(const T *src, int64_t count, A *dst) {
    for (int64_t i = 0; i < count; ++i) dst[i] = prl::load(src[i]);
}

// One forward step's cells, of the state columns [j_begin, j_end): gates_t holds the input half
// on entry, the pre-activations on return; rec [batch, ld] the recurrent product.  No branch in
// the column loop: GCC vectorises it.
template <typename T, typename A>
PRL_CPU_CLONES void forward_cells(int64_t batch, int64_t state, T *__restrict gates_t, const A *__restrict rec,
                                  int64_t ld, const T *__restrict old_cell, T *__restrict new_h,
                                  T *__restrict new_cell, int64_t j_begin, int64_t j_end) {
    for (int64_t b = 0; b < batch; ++b) {
        T *__restrict gi = gates_t + b * 3 * state, *__restrict go = gi + state, *__restrict gc = go + state;
        const A *__restrict ri = rec + b * ld, *__restrict ro = ri + state, *__restrict rc = ro + state;
        for (int64_t j = j_begin; j < j_end; ++j) {
            // the pre-activations as stored, as the step-by-step path reads them
            const T si = prl::store<T>(prl::load(gi[j]) + ri[j]), so = prl::store<T>(prl::load(go[j]) + ro[j]),
                    sc = prl::store<T>(prl::load(gc[j]) + rc[j]);
            gi[j] = si;
            go[j] = so;
            gc[j] = sc;
            A h, c;
            prl::lltm_forward_math<T>(prl::load(si), prl::load(so), prl::load(sc), prl::load(old_cell[b * state + j]),
                                      h, c);
            new_h[b * state + j] = prl::store<T>(h);
            new_cell[b * state + j] = prl::store<T>(c);
        }
    }
}

// One backward step's cells, of the state columns [j_begin, j_end): the gradient reaching h_t
// (grad_output[t] plus rec, the product of step t + 1's d_gates with W_h: zeros for the last
// step); the gradient of new_cell is carried in d_cell, updated in place (the value its dtype
// stores).
template <typename T, typename A>
PRL_CPU_CLONES void backward_cells(int64_t batch, int64_t state, const T *__restrict grad_out_t,
                                   const A *__restrict rec, int64_t ld, const T *__restrict gates_t,
                                   const T *__restrict old_cell, A *__restrict d_cell, T *__restrict d_gates_t,
                                   int64_t j_begin, int64_t j_end) {
    for (int64_t b = 0; b < batch; ++b) {
        const T *__restrict gi = gates_t + b * 3 * state, *__restrict go = gi + state, *__restrict gc = go + state;
        T *__restrict di = d_gates_t + b * 3 * state, *__restrict d_o = di + state, *__restrict dc = d_o + state;
        const A *__restrict r = rec + b * ld;
        A *__restrict carried = d_cell + b * state;
        for (int64_t j = j_begin; j < j_end; ++j) {
            const A grad_h = prl::load(prl::store<T>(prl::load(grad_out_t[b * state + j]) + r[j]));
            A d_i, d_out, d_cand, d_c;
            prl::lltm_backward_math<T>(grad_h, carried[j], prl::load(gi[j]), prl::load(go[j]), prl::load(gc[j]),
                                       prl::load(old_cell[b * state + j]), d_i, d_out, d_cand, d_c);
            di[j] = prl::store<T>(d_i);
            d_o[j] = prl::store<T>(d_out);
            dc[j] = prl::store<T>(d_cand);
            carried[j] = prl::load(prl::store<T>(d_c));
        }
    }
}

// How a call's work is split among threads.  Waking the threads costs microseconds (about
// ten on 16 cores):
//   - by rows (row_parts > 0): parts of as nearly equal row counts as the batch allows (each
//     part's rows in whole tiles, then the rows left over as one narrower tile: `product`),
//     each running the whole sequence, each with at least kMinPartWork multiply-adds over the
//     sequence, at most as many parts as the batch has tiles.  Parts of whole tiles were up
//     to a tile apart: 34 and 30 rows of a batch of 64, 10 and 6 of 16, on two threads.
//     Where the batch has fewer tiles than threads (6-row tiles: B = 64 is 11 tiles), parts
//     of fewer rows than a tile, each with at least kMinStepPartSequenceWork over the
//     sequence: on a 16-core Xeon 0.80-0.93x the time at (T, B, I, S) = (100, 64, 256, 256),
//     (50, 64, 64, 128), (100, 32, 64, 128) with 8-16 parts in place of 6-11, the same at (16,
//     64, 16, 256), but 1.26x at (8, 32, 8, 64) training (0.4M multiply-adds a part), which the
//     minimum keeps on 6 (benchmarks/NOTES.md).  Parts of a single row where the batch has
//     kMinRowSplitBatch rows or more, else of kMinPartRows: at B = 8-16 on the Xeon the 4-row
//     parts left the row split at 2-4 parts, so a column split ran, each step a round of all
//     16 threads; parts of one or two rows took 0.52-0.67x the time in inference and 0.58-0.80x
//     in fwd+bwd at (30, 8 and 16, 256, 256), (100, 8, 128, 128), (100, 12, 64, 256), within
//     the noise at B = 32-64.  Smaller batches keep to the split below: on the 2-core VM a batch
//     of 2 in two 1-row parts took up to 1.2x the column split's time (50, 2, 64, 512).  But each
//     row part streams all of W_h from its core's cache every step, for its few rows: where W_h
//     (as the product reads it) is over kMaxNarrowWeightBytes, parts are of kMinPartRows or more
//     whatever the batch, and where those are fewer than the threads the grid below takes the
//     batch (each of its parts reads its slice of W_h).  On the 16-core Xeon the grid took
//     0.65-0.86x the single-row parts' time at S = 256 (786 KB of float32 weights; (100, 12, 64,
//     256), (30, 8 and 16, 256, 256), (100, 16, 128, 256)) and 0.38-0.48x at (100, 12, 256, 512),
//     but 1.06-1.31x at S = 128 (196 KB; (100, 8, 128, 128)) and below, and parts of 4 rows in
//     place of the grid or of smaller parts lost up to 1.3x (benchmarks/NOTES.md).  Machines with
//     threads no more than tiles (two threads) split as before;
//   - by rows and state columns (grid_rows x grid_columns parts, the grid), where the batch has
//     too few rows for the threads: where a column split of a step (step_parts ranges of
//     column panels, each with at least kMinStepPartWork multiply-adds a step and
//     kMinStepPartSequenceWork over the sequence) would give more than twice the threads the
//     row split can (small batches, wide states), or where the row split would leave the call
//     on one thread (the first rule alone never splits on two threads).  Part (r, g) runs, step
//     after step, the product of its rows with the columns of W_h its state columns' three
//     gates need, then those cells; a step's parts start once every part of the step before
//     has returned (prl::run_rounds: one parallel region for the whole sequence, member m
//     takes part m, so its slice of W_h stays in its core's cache).  Parts of at least
//     kMinGridPartWork multiply-adds a step, as many state columns as there are panels at
//     most, in powers of two, then rows.  It replaced a column split whose cells ran as a
//     round of their own (two rounds a step, the gates crossing cores between them): on a
//     16-core Xeon with the library's products 0.71-0.94x its time at B = 1-4, S = 128-512
//     (float64 0.55-0.63x); on the 2-core development VM within its noise (benchmarks/NOTES.md).
// And the product itself: where a BLAS was handed over (pyroundlib hands torch's MKL over on
// Intel CPUs: pyroundlib/_threads.py), batches of at most kBlasMaxBatch rows with at least
// kBlasMinWork multiply-adds a step run it step by step, one BLAS call a step, unless the
// sequence has kGridOverBlasRows rows (steps x batch) or more and a state of at most
// kGridOverBlasMaxState: those take the grid.  On a 16-core Xeon MKL's products took 0.5-0.75x
// the time of the column split at (T, B, S) = (8, 1, 256), (100, 1, 256), (30, 4, 256); the
// grid took 0.56-0.99x MKL's time (median 0.80) at T x B = 64-256 and S = 128-256, but
// 0.9-1.8x it at T x B <= 32 (the grid packs W_h, and each part first reads its slice from the
// cores that packed it, once a call; MKL reads W_h as it is) and up to 1.25x at S = 512 below
// T x B = 256; on the development VM (2-core AMD EPYC, where MKL does not run its best code)
// MKL took up to 2.3x the library's time.  Larger batches: the library's product as fast or
// faster on both.  Decided by the machine and the sizes, never the thread count: the BLAS's
// and the library's products round differently, and a choice by thread count would add that
// difference to whatever the BLAS's own threading changes.
constexpr double kMinPartWork = double(1 << 18);
constexpr double kMinStepPartWork = double(1 << 16);
constexpr double kMinStepPartSequenceWork = double(1 << 21);
constexpr double kMinGridPartWork = double(1 << 14);
constexpr int64_t kMinPartRows = 4;
constexpr int64_t kMinRowSplitBatch = 8;
constexpr double kMaxNarrowWeightBytes = double(1 << 19);
constexpr int64_t kBlasMaxBatch = 4;
constexpr double kBlasMinWork = double(1 << 17);
constexpr int64_t kGridOverBlasRows = 64;
constexpr int64_t kGridOverBlasMaxState = 256;

// The first of n items in part p of `parts` nearly equal ones, and its count.
inline void split(int64_t p, int64_t n, int64_t parts, int64_t &first, int64_t &count) {
    first = p * n / parts;
    count = (p + 1) * n / parts - first;
}

struct Plan {
    int64_t rows_per_tile, row_parts, grid_rows, grid_columns;
    bool blas;

    // a product of [batch, k] x [k, cols] per step (forward: k = state, cols = 3 x state;
    // backward: k = 3 x state, cols = state) of element_bytes elements, for `steps` steps;
    // have_blas: one is there
    Plan(int64_t steps, int64_t batch, int64_t k, int64_t cols, int64_t state, int64_t panel_width,
         int64_t element_bytes, bool have_blas) {
        const int64_t threads = prl::cpu_threads();
        rows_per_tile = batch == 1 ? 1 : tile_rows();
        const int64_t tiles = (batch + rows_per_tile - 1) / rows_per_tile;
        const int64_t panels = (cols + panel_width - 1) / panel_width;
        const double step_work = double(batch) * double(k) * double(cols);
        const int64_t sequence_parts = limit(double(steps) * step_work / kMinStepPartSequenceWork);
        const bool wide_weights = double(k) * double(cols) * double(element_bytes) > kMaxNarrowWeightBytes;
        const int64_t narrow = std::min(batch >= kMinRowSplitBatch && !wide_weights ? batch : batch / kMinPartRows,
                                        sequence_parts);
        const int64_t by_rows = std::min({threads, std::max(tiles, narrow),
                                          limit(double(steps) * step_work / kMinPartWork)});
        const int64_t step_parts = std::min({threads, panels, limit(step_work / kMinStepPartWork), sequence_parts});
        const bool blas_sizes = have_blas && batch <= kBlasMaxBatch && step_work >= kBlasMinWork;
        blas = blas_sizes && (steps * batch < kGridOverBlasRows || state > kGridOverBlasMaxState);
        // a batch that would have taken single rows but for wide weights, with too few rows for
        // parts of kMinPartRows on every thread
        const bool few_wide_rows = wide_weights && batch >= kMinRowSplitBatch && narrow < threads;
        const bool grid = !blas && (blas_sizes || step_parts > 2 * by_rows || (by_rows == 1 && step_parts > 1) ||
                                    (few_wide_rows && step_parts > by_rows));
        row_parts = blas || grid ? 0 : by_rows;
        grid_rows = grid_columns = 0;
        if (grid) {
            const int64_t parts = std::min(threads, limit(step_work / kMinGridPartWork));
            const int64_t state_panels = (state + panel_width - 1) / panel_width;
            grid_columns = 1;
            while (2 * grid_columns <= std::min(parts, state_panels)) grid_columns *= 2;
            grid_rows = std::max<int64_t>(1, std::min(batch, parts / grid_columns));
        }
    }
    static int64_t limit(double parts) { return int64_t(std::min(std::max(1.0, parts), 1e9)); }
    // row_parts > 0: the first row of part p and its row count (the most: part_rows)
    void rows(int64_t p, int64_t batch, int64_t &first, int64_t &count) const {
        split(p, batch, row_parts, first, count);
    }
    int64_t part_rows(int64_t batch) const { return (batch + row_parts - 1) / row_parts; }
    // the grid: its parts, and part p's rows [first, first + count) and state columns [s0, s1)
    // (whole panels of the state's columns but the last)
    int64_t grid_parts() const { return grid_rows * grid_columns; }
    int64_t grid_part_rows(int64_t batch) const { return (batch + grid_rows - 1) / grid_rows; }
    void grid_part(int64_t p, int64_t batch, int64_t state, int64_t panel_width, int64_t &first, int64_t &count,
                   int64_t &s0, int64_t &s1) const {
        split(p / grid_columns, batch, grid_rows, first, count);
        const int64_t panels = (state + panel_width - 1) / panel_width, g = p % grid_columns;
        s0 = std::min(state, panel_width * (g * panels / grid_columns));
        s1 = std::min(state, panel_width * ((g + 1) * panels / grid_columns));
    }
};

// The columns [begin, end) of a product for the columns [a, b) of a grid part: the whole panels
// that hold them.  The columns past [a, b) in those panels are computed too, into the part's
// own buffer, and not read.
template <typename A> void covering_panels(int64_t a, int64_t b, int64_t &begin, int64_t &end) {
    begin = a / kCols<A> * kCols<A>;
    end = round_up(b, kCols<A>);
}

// The rows of each step: all `batch` of them (sizes NULL), or the first sizes[t] (a packed
// batch: sizes[0] = batch, never growing).  Step t's rows start at row first(t) of the
// step-major buffers.
class Rows {
  public:
    Rows(const int64_t *sizes, int64_t steps, int64_t batch) : sizes_(sizes), batch_(batch) {
        if (sizes == nullptr) return;
        first_.resize((size_t)steps + 1, 0);
        for (int64_t t = 0; t < steps; ++t) first_[(size_t)t + 1] = first_[(size_t)t] + sizes[t];
    }
    int64_t at(int64_t t) const { return sizes_ ? sizes_[t] : batch_; }
    int64_t first(int64_t t) const { return sizes_ ? first_[(size_t)t] : t * batch_; }
    // of the rows [from, from + count): how many step t has (0 <= result <= count)
    int64_t in(int64_t t, int64_t from, int64_t count) const {
        return std::min(count, std::max<int64_t>(0, at(t) - from));
    }

  private:
    const int64_t *sizes_;
    int64_t batch_;
    std::vector<int64_t> first_;
};

// W_h [3S, S] (row stride ldw) in the arithmetic type A for the BLAS: as it is where T is A,
// else a copy (row stride S).  Returns the matrix and sets ld to its row stride.
template <typename T, typename A = prl::acc_t<T>>
const A *weights_for_blas(const T *w_h, int64_t ldw, int64_t state, std::vector<A> &copy, int64_t &ld) {
    if constexpr (std::is_same_v<T, A>) {
        ld = ldw;
        return w_h;
    } else {
        copy.resize((size_t)(3 * state * state));
        for (int64_t g = 0; g < 3 * state; ++g) to_arithmetic(w_h + g * ldw, state, copy.data() + g * state);
        ld = state;
        return copy.data();
    }
}

// Rows per chunk of a step's cells where a BLAS runs the steps: about prl::kGrain gate elements.
int64_t cell_rows(int64_t state) { return std::max<int64_t>(1, prl::kGrain / (3 * state)); }

template <typename T>
void forward(T *gates, const T *w_h, int64_t ldw, const T *h0, const T *c0, T *output, T *cells, T *c_n,
             int64_t steps, int64_t batch, int64_t state, const Rows &rows) {
    using A = prl::acc_t<T>;
    const int64_t width = 3 * state, n = round_up(width, kCols<A>), cell = batch * state;
    const prl::Blas<A> blas = prl::blas<A>();
    const Plan plan(steps, batch, state, width, state, kCols<A>, (int64_t)sizeof(A), bool(blas));
    if (plan.blas) {
        // step by step, each step's product one BLAS call: left holds h_{t-1}, the cells write
        // the next one
        std::vector<A> w_copy, left((size_t)cell), rec((size_t)(batch * n));
        int64_t ld_blas = 0;
        const A *w_blas = weights_for_blas(w_h, ldw, state, w_copy, ld_blas);
        to_arithmetic(h0, cell, left.data());
        for (int64_t t = 0; t < steps; ++t) {
            const int64_t now = rows.at(t);
            blas.product(left.data(), state, w_blas, ld_blas, true, rec.data(), n, now, width, state);
            T *gates_t = gates + rows.first(t) * width, *h_t = output + rows.first(t) * state;
            T *c_t = cells + rows.first(t) * state;
            const T *old_cell = t == 0 ? c0 : cells + rows.first(t - 1) * state;
            prl::run_chunks(now, cell_rows(state), [&](int64_t first, int64_t last) {
                forward_cells<T, A>(last - first, state, gates_t + first * width, rec.data() + first * n, n,
                                    old_cell + first * state, h_t + first * state, c_t + first * state, 0, state);
                to_arithmetic(h_t + first * state, (last - first) * state, left.data() + first * state);
            });
        }
        if (c_n != nullptr)
            for (int64_t t = 0; t < steps; ++t) {  // the rows that end at step t
                const int64_t now = rows.at(t), next = t + 1 < steps ? rows.at(t + 1) : 0;
                const T *c_t = cells + rows.first(t) * state;
                std::copy(c_t + next * state, c_t + now * state, c_n + next * state);
            }
        return;
    }
    const Panels<A> w = pack_panels_transposed<A>(w_h, ldw, state, width, n);
    // One part's step: the rows [first, first + now) (a packed batch's shrink: only the rows the
    // step has) and state columns [s0, s1): left <- h_{t-1}, rec <- the product with the
    // columns of the three gates (the panels that hold them: one product where they meet), the
    // cells; c_n for the rows that end at the step.
    const auto step = [&](int64_t t, int64_t first, int64_t now, int64_t next, int64_t s0, int64_t s1, A *left,
                          A *rec) {
        const int64_t at = first * state;
        to_arithmetic((t == 0 ? h0 : output + rows.first(t - 1) * state) + at, now * state, left);
        int64_t begin = 0, end = 0;
        for (int64_t g = 0; g < 3; ++g) {
            int64_t b, e;
            covering_panels<A>(g * state + s0, g * state + s1, b, e);
            if (g > 0 && b <= end) {
                end = e;
                continue;
            }
            if (g > 0) product(plan.rows_per_tile, left, state, w.data(), rec, n, 0, now, begin, end);
            begin = b;
            end = e;
        }
        product(plan.rows_per_tile, left, state, w.data(), rec, n, 0, now, begin, end);
        T *c_t = cells + rows.first(t) * state + at;
        forward_cells<T, A>(now, state, gates + rows.first(t) * width + 3 * at, rec, n,
                            (t == 0 ? c0 : cells + rows.first(t - 1) * state) + at,
                            output + rows.first(t) * state + at, c_t, s0, s1);
        if (c_n != nullptr)
            for (int64_t b = next; b < now; ++b)
                std::copy(c_t + b * state + s0, c_t + b * state + s1, c_n + at + b * state + s0);
    };
    if (plan.row_parts == 0) {  // the grid: a round a step
        const int64_t parts = plan.grid_parts(), part_rows = plan.grid_part_rows(batch);
        const int64_t scratch_per_part = part_rows * (state + n);  // left, then rec
        std::vector<A> scratch((size_t)(parts * scratch_per_part), A(0));
        prl::run_rounds(steps, parts, [&](int64_t) { return parts; }, [&](int64_t t, int64_t p) {
            int64_t first, count, s0, s1;
            plan.grid_part(p, batch, state, kCols<A>, first, count, s0, s1);
            const int64_t now = rows.in(t, first, count), next = t + 1 < steps ? rows.in(t + 1, first, count) : 0;
            if (now > 0)
                step(t, first, now, next, s0, s1, scratch.data() + p * scratch_per_part,
                     scratch.data() + p * scratch_per_part + part_rows * state);
        });
        return;
    }
    const int64_t part_rows = plan.part_rows(batch);
    const int64_t scratch_per_part = part_rows * (state + n);  // left, then rec
    std::vector<A> scratch((size_t)(plan.row_parts * scratch_per_part), A(0));
    prl::run_parts(plan.row_parts, [&](int64_t p) {  // each part the whole sequence
        int64_t first, count;
        plan.rows(p, batch, first, count);
        for (int64_t t = 0; t < steps; ++t) {
            const int64_t now = rows.in(t, first, count), next = t + 1 < steps ? rows.in(t + 1, first, count) : 0;
            if (now == 0) break;  // this part's rows have all ended
            step(t, first, now, next, 0, state, scratch.data() + p * scratch_per_part,
                 scratch.data() + p * scratch_per_part + part_rows * state);
        }
    });
}

template <typename T>
void backward(const T *grad_output, const T *grad_c_n, const T *gates, const T *w_h, int64_t ldw, const T *c0,
              const T *cells, T *d_gates, T *d_h0, T *d_c0, int64_t steps, int64_t batch, int64_t state,
              const Rows &rows) {
    using A = prl::acc_t<T>;
    const int64_t n = round_up(state, kCols<A>), cell = batch * state, k = 3 * state;
    const prl::Blas<A> blas = prl::blas<A>();
    const Plan plan(steps, batch, k, state, state, kCols<A>, (int64_t)sizeof(A), bool(blas));
    if (plan.blas) {
        // step by step, each step's product one BLAS call: left holds d_gates[t + 1] (rows past
        // it zero: in a packed batch a row enters at its own last step, with no gradient from a
        // later one), the cells write the next one
        std::vector<A> w_copy, left((size_t)(batch * k), A(0)), rec((size_t)(batch * n), A(0)), d_cell((size_t)cell);
        int64_t ld_blas = 0;
        const A *w_blas = weights_for_blas(w_h, ldw, state, w_copy, ld_blas);
        for (int64_t i = 0; i < cell; ++i) d_cell[(size_t)i] = grad_c_n ? prl::load(grad_c_n[i]) : A(0);
        for (int64_t t = steps - 1; t >= 0; --t) {
            // rec: zeros for the last step, which gets no gradient from a later one, and for
            // rows past those of step t + 1 (never written)
            if (t + 1 < steps)
                blas.product(left.data(), k, w_blas, ld_blas, false, rec.data(), n, rows.at(t + 1), state, k);
            const T *grad_t = grad_output + rows.first(t) * state, *gates_t = gates + rows.first(t) * k;
            const T *old_cell = t == 0 ? c0 : cells + rows.first(t - 1) * state;
            T *d_gates_t = d_gates + rows.first(t) * k;
            prl::run_chunks(rows.at(t), cell_rows(state), [&](int64_t first, int64_t last) {
                backward_cells<T, A>(last - first, state, grad_t + first * state, rec.data() + first * n, n,
                                     gates_t + first * k, old_cell + first * state, d_cell.data() + first * state,
                                     d_gates_t + first * k, 0, state);
                to_arithmetic(d_gates_t + first * k, (last - first) * k, left.data() + first * k);
            });
        }
        for (int64_t i = 0; i < cell; ++i) d_c0[i] = prl::store<T>(d_cell[(size_t)i]);  // exact: stored values
        // d_h0 = d_gates[0] @ W_h
        blas.product(left.data(), k, w_blas, ld_blas, false, rec.data(), n, batch, state, k);
        for (int64_t b = 0; b < batch; ++b)
            for (int64_t j = 0; j < state; ++j) d_h0[b * state + j] = prl::store<T>(rec[(size_t)(b * n + j)]);
        return;
    }
    const Panels<A> w = pack_panels<A>(w_h, ldw, k, state, n);
    // A part's rows [first, first + count) and state columns [s0, s1), with its buffers: left
    // (d_gates of a step, its rows past the next step's zero, never written: a packed batch's
    // rows enter at their own last step, with no gradient from a later one), rec (zero to start
    // with: the last step gets no gradient from a later one) and the carried d_cell.
    struct Part {
        int64_t first, count, s0, s1;
        A *left, *rec, *d_cell;
    };
    const auto start = [&](const Part &q) {
        for (int64_t b = 0; b < q.count; ++b)
            for (int64_t j = q.s0; j < q.s1; ++j)
                q.d_cell[b * state + j] = grad_c_n ? prl::load(grad_c_n[(q.first + b) * state + j]) : A(0);
    };
    const auto step = [&](const Part &q, int64_t t) {
        const int64_t at = q.first * state, now = rows.in(t, q.first, q.count);
        if (now == 0) return;  // this part's rows have not started yet
        int64_t begin, end;
        covering_panels<A>(q.s0, q.s1, begin, end);
        if (t + 1 < steps) {
            to_arithmetic(d_gates + rows.first(t + 1) * k + 3 * at, rows.in(t + 1, q.first, q.count) * k, q.left);
            product(plan.rows_per_tile, q.left, k, w.data(), q.rec, n, 0, now, begin, end);
        }
        backward_cells<T, A>(now, state, grad_output + rows.first(t) * state + at, q.rec, n,
                             gates + rows.first(t) * k + 3 * at, (t == 0 ? c0 : cells + rows.first(t - 1) * state) + at,
                             q.d_cell, d_gates + rows.first(t) * k + 3 * at, q.s0, q.s1);
    };
    const auto finish = [&](const Part &q) {  // d_c0, and d_h0 = d_gates[0] W_h
        const int64_t at = q.first * state;
        int64_t begin, end;
        covering_panels<A>(q.s0, q.s1, begin, end);
        for (int64_t b = 0; b < q.count; ++b)  // exact: d_cell holds stored values
            for (int64_t j = q.s0; j < q.s1; ++j) d_c0[at + b * state + j] = prl::store<T>(q.d_cell[b * state + j]);
        to_arithmetic(d_gates + 3 * at, q.count * k, q.left);
        product(plan.rows_per_tile, q.left, k, w.data(), q.rec, n, 0, q.count, begin, end);
        for (int64_t b = 0; b < q.count; ++b)
            for (int64_t j = q.s0; j < q.s1; ++j) d_h0[at + b * state + j] = prl::store<T>(q.rec[b * n + j]);
    };
    const auto part = [&](int64_t part_rows, A *scratch, int64_t first, int64_t count, int64_t s0, int64_t s1) {
        return Part{first, count, s0, s1, scratch, scratch + part_rows * k, scratch + part_rows * (k + n)};
    };
    if (plan.row_parts == 0) {  // the grid: round i < steps is step steps - 1 - i; round steps: finish
        const int64_t parts = plan.grid_parts(), part_rows = plan.grid_part_rows(batch);
        const int64_t scratch_per_part = part_rows * (k + n + state);  // left, rec, d_cell
        std::vector<A> scratch((size_t)(parts * scratch_per_part), A(0));
        prl::run_rounds(steps + 1, parts, [&](int64_t) { return parts; }, [&](int64_t i, int64_t p) {
            int64_t first, count, s0, s1;
            plan.grid_part(p, batch, state, kCols<A>, first, count, s0, s1);
            const Part q = part(part_rows, scratch.data() + p * scratch_per_part, first, count, s0, s1);
            if (i == 0) start(q);
            if (i < steps) step(q, steps - 1 - i);
            else finish(q);
        });
        return;
    }
    const int64_t part_rows = plan.part_rows(batch);
    const int64_t scratch_per_part = part_rows * (k + n + state);  // left, rec, d_cell
    std::vector<A> scratch((size_t)(plan.row_parts * scratch_per_part), A(0));
    prl::run_parts(plan.row_parts, [&](int64_t p) {  // each part the whole sequence
        int64_t first, count;
        plan.rows(p, batch, first, count);
        const Part q = part(part_rows, scratch.data() + p * scratch_per_part, first, count, 0, state);
        start(q);
        for (int64_t t = steps - 1; t >= 0; --t) step(q, t);
        finish(q);
    });
}

// c = left @ w for m rows of left [m, k]: w packed in panels, np columns (a multiple of
// kCols); blocks of 8 row tiles, split among the threads where each part has at least
// kMinPartWork multiply-adds.  fill(first, count, left) writes rows [first, first + count) of
// left (row stride k); store(first, count, out) takes their product (row stride np).  Each
// element is one sum over k in order, whichever part computes it.
template <typename A, typename Fill, typename Store>
void product_in_blocks(int64_t m, int64_t k, const Panels<A> &w, int64_t np, Fill &&fill, Store &&store) {
    const int64_t tile = tile_rows(), block = 8 * tile, blocks = (m + block - 1) / block;
    const double work = double(m) * double(k) * double(np);
    const int64_t parts = std::max<int64_t>(
        1, std::min<int64_t>({blocks, prl::cpu_threads(), (int64_t)std::min(work / kMinPartWork, 1e9)}));
    const int64_t scratch_per_part = block * (k + np);  // left, then the block's product
    std::vector<A> scratch((size_t)(parts * scratch_per_part));
    prl::run_parts(parts, [&](int64_t part) {
        A *left = scratch.data() + part * scratch_per_part, *out = left + block * k;
        for (int64_t at = part * blocks / parts; at < (part + 1) * blocks / parts; ++at) {
            const int64_t first = at * block, count = std::min(block, m - first);
            fill(first, count, left);
            product(tile, left, k, w.data(), out, np, 0, count, 0, np);
            store(first, count, static_cast<const A *>(out));
        }
    });
}

// The input half of every row: gates[r] = input[r] @ W_x^T + bias, W_x the last `features`
// columns of weights [3S, S + features], by the library's own product (W_x^T packed in panels,
// then product_in_blocks).  The Python package hands it the products too small for a BLAS's
// threads to pay (sequence.INPUT_HALF_IN_LIBRARY_BELOW): on a 16-core Xeon torch's MKL ran
// [170-199, 8] x [8, 192] on a team of 4-6 of its 16 OpenMP threads, libgomp ended the surplus
// threads, and the library's next full-size region started them again, 10-12 thread starts a
// call; and, on x86 CPUs other than Intel's with AVX-512, those of 32 features or more: MKL's
// product took 1.4-2.1x the library's time on an AMD EPYC (benchmarks/NOTES.md).  Each element
// is one sum over the features in order, then + bias.
template <typename T>
void input_half(const T *input, const T *weights, const T *bias, T *gates, int64_t rows, int64_t features,
                int64_t state) {
    using A = prl::acc_t<T>;
    const int64_t width = 3 * state, n = round_up(width, kCols<A>), ldw = state + features;
    const Panels<A> w = pack_panels_transposed<A>(weights + state, ldw, features, width, n);
    std::vector<A> b((size_t)width, A(0));
    if (bias != nullptr) to_arithmetic(bias, width, b.data());
    product_in_blocks<A>(
        rows, features, w, n,
        [&](int64_t first, int64_t count, A *left) { to_arithmetic(input + first * features, count * features, left); },
        [&](int64_t first, int64_t count, const A *out) {
            for (int64_t r = 0; r < count; ++r)
                for (int64_t g = 0; g < width; ++g)
                    gates[(first + r) * width + g] = prl::store<T>(out[r * n + g] + b[(size_t)g]);
        });
}

// c = op(a) @ b by the same product: op(a) [m, k] is a (row stride lda) or, transposed, the
// transpose of a [k, m] (row stride lda); b [k, n] (row stride ldb) packed in panels; c [m, n]
// (row stride ldc).  The backward's gradient products on the same CPUs (sequence.cpu_product),
// where MKL's took 1.1-2.1x the library's time from 32 columns on.
template <typename T>
void matmul(const T *a, int64_t lda, bool transposed, const T *b, int64_t ldb, T *c, int64_t ldc, int64_t m,
            int64_t n, int64_t k) {
    using A = prl::acc_t<T>;
    const int64_t np = round_up(n, kCols<A>);
    const Panels<A> w = pack_panels<A>(b, ldb, k, n, np);
    product_in_blocks<A>(
        m, k, w, np,
        [&](int64_t first, int64_t count, A *left) {
            if (transposed) {
                // row r of op(a) is column first + r of a, taken 16 of a's rows at a time so that
                // each row of left is written a cache line at a time: filled a column at a time,
                // left's rows k apart fell into the same cache sets where k is a power of two
                // (3.3-3.9x the product's time at k = 512 and 1024 on the development VM)
                for (int64_t i0 = 0; i0 < k; i0 += 16) {
                    const int64_t i1 = std::min(k, i0 + 16);
                    for (int64_t r = 0; r < count; ++r)
                        for (int64_t i = i0; i < i1; ++i) left[r * k + i] = prl::load(a[i * lda + first + r]);
                }
            } else {
                for (int64_t r = 0; r < count; ++r) to_arithmetic(a + (first + r) * lda, k, left + r * k);
            }
        },
        [&](int64_t first, int64_t count, const A *out) {
            for (int64_t r = 0; r < count; ++r)
                for (int64_t j = 0; j < n; ++j) c[(first + r) * ldc + j] = prl::store<T>(out[r * np + j]);
        });
}

}  // namespace

extern "C" PRL_API prl_status prl_lltm_sequence_forward_cpu(void *gates, const void *w_h, int64_t ldw, const void *h0,
                                                            const void *c0, void *output, void *cells, void *c_n,
                                                            int64_t steps, int64_t batch, int64_t state, int dtype) {
    return prl_lltm_sequence_packed_forward_cpu(gates, w_h, ldw, h0, c0, output, cells, c_n, nullptr, steps, batch,
                                                state, dtype);
}

extern "C" PRL_API prl_status prl_lltm_sequence_backward_cpu(const void *grad_output, const void *grad_c_n,
                                                             const void *gates, const void *w_h, int64_t ldw,
                                                             const void *c0, const void *cells, void *d_gates,
                                                             void *d_h0, void *d_c0, int64_t steps, int64_t batch,
                                                             int64_t state, int dtype) {
    return prl_lltm_sequence_packed_backward_cpu(grad_output, grad_c_n, gates, w_h, ldw, c0, cells, d_gates, d_h0,
                                                 d_c0, nullptr, steps, batch, state, dtype);
}

namespace {
// A packed batch's sizes: NULL (every step all `batch` rows), or sizes[0] = batch and each
// size in [1, the size before].  *rows: how many rows the step-major buffers hold.
prl_status check_batch_sizes(const char *fn, const int64_t *sizes, int64_t steps, int64_t batch, int64_t *rows) {
    *rows = steps * batch;
    if (sizes == nullptr || steps == 0) return PRL_SUCCESS;
    if (sizes[0] != batch)
        return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: argument 'batch_sizes' must start with batch (%lld), got "
                         "%lld", fn, (long long)batch, (long long)sizes[0]);
    for (int64_t t = 1; t < steps; ++t)
        if (sizes[t] < 1 || sizes[t] > sizes[t - 1])
            return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: argument 'batch_sizes' must not grow and stay >= 1 "
                             "(a sorted pack's), got %lld after %lld at step %lld", fn, (long long)sizes[t],
                             (long long)sizes[t - 1], (long long)t);
    *rows = 0;
    for (int64_t t = 0; t < steps; ++t) *rows += sizes[t];
    return PRL_SUCCESS;
}
}  // namespace

extern "C" PRL_API prl_status prl_lltm_sequence_packed_forward_cpu(void *gates, const void *w_h, int64_t ldw,
                                                                   const void *h0, const void *c0, void *output,
                                                                   void *cells, void *c_n,
                                                                   const int64_t *batch_sizes, int64_t steps,
                                                                   int64_t batch, int64_t state, int dtype) {
    PRL_API_BEGIN
    const char *fn = __func__;
    PRL_TRY(prl::check_sequence_forward_args(fn, gates, w_h, ldw, h0, c0, output, cells, steps, batch, state));
    int64_t all_rows = 0;
    PRL_TRY(check_batch_sizes(fn, batch_sizes, steps, batch, &all_rows));
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (all_rows * state == 0) return PRL_SUCCESS;
        forward<T>(static_cast<T *>(gates), static_cast<const T *>(w_h), ldw, static_cast<const T *>(h0),
                   static_cast<const T *>(c0), static_cast<T *>(output), static_cast<T *>(cells),
                   static_cast<T *>(c_n), steps, batch, state, Rows(batch_sizes, steps, batch));
        return PRL_SUCCESS;
    });
    PRL_API_END
}

extern "C" PRL_API prl_status prl_lltm_sequence_packed_backward_cpu(const void *grad_output, const void *grad_c_n,
                                                                    const void *gates, const void *w_h, int64_t ldw,
                                                                    const void *c0, const void *cells, void *d_gates,
                                                                    void *d_h0, void *d_c0,
                                                                    const int64_t *batch_sizes, int64_t steps,
                                                                    int64_t batch, int64_t state, int dtype) {
    PRL_API_BEGIN
    const char *fn = __func__;
    PRL_TRY(prl::check_sequence_backward_args(fn, grad_output, gates, w_h, ldw, c0, cells, d_gates, d_h0, d_c0, steps,
                                              batch, state));
    int64_t all_rows = 0;
    PRL_TRY(check_batch_sizes(fn, batch_sizes, steps, batch, &all_rows));
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (all_rows * state == 0) return PRL_SUCCESS;
        backward<T>(static_cast<const T *>(grad_output), static_cast<const T *>(grad_c_n),
                    static_cast<const T *>(gates), static_cast<const T *>(w_h), ldw, static_cast<const T *>(c0),
                    static_cast<const T *>(cells), static_cast<T *>(d_gates), static_cast<T *>(d_h0),
                    static_cast<T *>(d_c0), steps, batch, state, Rows(batch_sizes, steps, batch));
        return PRL_SUCCESS;
    });
    PRL_API_END
}

extern "C" PRL_API prl_status prl_lltm_input_half_cpu(const void *input, const void *weights, const void *bias,
                                                      void *gates, int64_t rows, int64_t features, int64_t state,
                                                      int dtype) {
    PRL_API_BEGIN
    const char *fn = __func__;
    PRL_TRY(prl::check_count(fn, "rows", rows));
    PRL_TRY(prl::check_count(fn, "features", features));
    PRL_TRY(prl::check_count(fn, "state", state));
    const auto fits = [](int64_t a, int64_t b) { return a == 0 || b <= prl::kMaxElements / a; };
    if (state > prl::kMaxElements / 4 || features > prl::kMaxElements / 4 || !fits(rows, 3 * state) ||
        !fits(rows, features) || !fits(3 * state, state + features))
        return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: rows=%lld, features=%lld, state=%lld: a buffer of more "
                         "elements than any can hold", fn, (long long)rows, (long long)features, (long long)state);
    const int64_t all = rows * 3 * state;
    PRL_TRY(prl::check_pointer(fn, "input", input, rows * features));
    PRL_TRY(prl::check_pointer(fn, "weights", weights, all == 0 ? 0 : 3 * state * (state + features)));
    PRL_TRY(prl::check_pointer(fn, "gates", gates, all));
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (all == 0) return PRL_SUCCESS;
        input_half<T>(static_cast<const T *>(input), static_cast<const T *>(weights), static_cast<const T *>(bias),
                      static_cast<T *>(gates), rows, features, state);
        return PRL_SUCCESS;
    });
    PRL_API_END
}

extern "C" PRL_API prl_status prl_matmul_cpu(const void *a, int64_t lda, int transpose_a, const void *b, int64_t ldb,
                                             void *c, int64_t ldc, int64_t m, int64_t n, int64_t k, int dtype) {
    PRL_API_BEGIN
    const char *fn = __func__;
    PRL_TRY(prl::check_count(fn, "m", m));
    PRL_TRY(prl::check_count(fn, "n", n));
    PRL_TRY(prl::check_count(fn, "k", k));
    if (transpose_a != 0 && transpose_a != 1)
        return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: argument 'transpose_a' must be 0 or 1, got %d", fn,
                         transpose_a);
    const int64_t a_rows = transpose_a ? k : m, a_cols = transpose_a ? m : k;
    if (lda < std::max<int64_t>(1, a_cols) || ldb < std::max<int64_t>(1, n) || ldc < std::max<int64_t>(1, n))
        return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: a row stride is shorter than its row: lda=%lld (a has %lld "
                         "columns), ldb=%lld, ldc=%lld (n=%lld)", fn, (long long)lda, (long long)a_cols,
                         (long long)ldb, (long long)ldc, (long long)n);
    const auto fits = [](int64_t rows, int64_t ld) { return rows == 0 || ld <= prl::kMaxElements / rows; };
    if (k > prl::kMaxElements / 64 || n > prl::kMaxElements / 64 || !fits(a_rows, lda) || !fits(k, ldb) ||
        !fits(m, ldc) || !fits(k, round_up(n, 64)) || !fits(64, k + round_up(n, 64)))
        return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: m=%lld, n=%lld, k=%lld: a buffer of more elements than "
                         "any can hold", fn, (long long)m, (long long)n, (long long)k);
    const auto span = [](int64_t rows, int64_t cols, int64_t ld) {
        return rows == 0 || cols == 0 ? 0 : (rows - 1) * ld + cols;
    };
    PRL_TRY(prl::check_pointer(fn, "a", a, m == 0 || n == 0 ? 0 : span(a_rows, a_cols, lda)));
    PRL_TRY(prl::check_pointer(fn, "b", b, m == 0 || n == 0 ? 0 : span(k, n, ldb)));
    PRL_TRY(prl::check_pointer(fn, "c", c, span(m, n, ldc)));
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (m == 0 || n == 0) return PRL_SUCCESS;
        T *out = static_cast<T *>(c);
        if (k == 0) {
            for (int64_t r = 0; r < m; ++r)
                for (int64_t j = 0; j < n; ++j) out[r * ldc + j] = prl::store<T>(prl::acc_t<T>(0));
            return PRL_SUCCESS;
        }
        matmul<T>(static_cast<const T *>(a), lda, transpose_a == 1, static_cast<const T *>(b), ldb, out, ldc, m, n,
                  k);
        return PRL_SUCCESS;
    });
    PRL_API_END
}
