// lltm_sequence_cpu.cpp - the LLTM's recurrence over a whole sequence on the CPU, one call
// per direction: prl_lltm_sequence_forward_cpu, prl_lltm_sequence_backward_cpu.
//
// The same contract as the persistent CUDA kernels (lltm_sequence_cuda.cu): the caller
// forms the input half of the gates for all steps at once; here every step's recurrent
// product and pointwise cell run in one native loop, so a short sequence pays no Python,
// dispatcher or ctypes overhead per step.  Per step:
//   - the left operand (h_{t-1}, or d_gates[t + 1] backward) is packed into an arithmetic-type
//     buffer whose row count is a multiple of the register tile;
//   - one register-tiled product with W_h, packed once per call (forward: transposed,
//     [S, 3S]; backward: as it is, [3S, S]), columns padded to the tile width with zeros;
//   - the pointwise cell of lltm.h, storing in the tensor's dtype wherever the step-by-step
//     path stores (the pre-activations, new_h, new_cell, the gradient reaching h_t), so both
//     paths round alike.
// The batch rows are split among up to prl_set_cpu_threads() threads (Split, below).
// Meant for sizes where a step's product is microseconds (the Python route with torch's
// GEMMs takes the larger ones).
#include <algorithm>
#include <vector>

#include "cpu_threads.h"
#include "lltm.h"

namespace {

// The register tile: kRows rows x kCols columns of accumulators, 3 x 32 floats (or 3 x 16
// doubles): 12 of AVX2's 16 vector registers, 6 of AVX-512's.  Measured on the development
// VM (AVX2), [33, 64] x [64, 192]: 81 GFLOP/s, against 52 for 4 x 32 (16 accumulators leave
// no register for the operands) and 2-5 for 16-column tiles, which GCC does not keep in
// registers.
constexpr int64_t kRows = 3;
template <typename A> constexpr int64_t kCols = 128 / (int64_t)sizeof(A);

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// c[rows, n] = a[rows, k] @ w[k, n] (row-major, rows % kRows == 0, n % kCols == 0).  The
// fixed-size inner loops keep the tile in registers; GCC vectorises the column loop.
template <typename A>
PRL_CPU_CLONES void product(const A *__restrict a, const A *__restrict w, A *__restrict c, int64_t rows, int64_t k,
                            int64_t n) {
    constexpr int64_t NC = kCols<A>;
    for (int64_t r0 = 0; r0 < rows; r0 += kRows)
        for (int64_t c0 = 0; c0 < n; c0 += NC) {
            A acc[kRows][NC] = {};
            for (int64_t i = 0; i < k; ++i) {
                const A *__restrict w_row = w + i * n + c0;
                for (int64_t r = 0; r < kRows; ++r) {
                    const A x = a[(r0 + r) * k + i];
                    for (int64_t q = 0; q < NC; ++q) acc[r][q] += x * w_row[q];
                }
            }
            for (int64_t r = 0; r < kRows; ++r)
                for (int64_t q = 0; q < NC; ++q) c[(r0 + r) * n + c0 + q] = acc[r][q];
        }
}

// dst[rows_padded, width] = src[rows, width] in the arithmetic type, zero rows past `rows`.
template <typename T, typename A>
void pack_rows(const T *src, int64_t rows, int64_t width, A *dst, int64_t rows_padded) {
    for (int64_t i = 0; i < rows * width; ++i) dst[i] = prl::load(src[i]);
    std::fill(dst + rows * width, dst + rows_padded * width, A(0));
}

// One forward step's cells: gates_t holds the input half on entry, the pre-activations on
// return; rec [batch, ld] the recurrent product.  No branch in the column loop: GCC vectorises it.
template <typename T, typename A>
PRL_CPU_CLONES void forward_cells(int64_t batch, int64_t state, T *__restrict gates_t, const A *__restrict rec,
                                  int64_t ld, const T *__restrict old_cell, T *__restrict new_h,
                                  T *__restrict new_cell) {
    for (int64_t b = 0; b < batch; ++b) {
        T *__restrict gi = gates_t + b * 3 * state, *__restrict go = gi + state, *__restrict gc = go + state;
        const A *__restrict ri = rec + b * ld, *__restrict ro = ri + state, *__restrict rc = ro + state;
        for (int64_t j = 0; j < state; ++j) {
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

// One backward step's cells: the gradient reaching h_t (grad_output[t] plus rec, the
// product of step t + 1's d_gates with W_h: zeros for the last step); the gradient of
// new_cell is carried in d_cell, updated in place (the value its dtype stores).
template <typename T, typename A>
PRL_CPU_CLONES void backward_cells(int64_t batch, int64_t state, const T *__restrict grad_out_t,
                                   const A *__restrict rec, int64_t ld, const T *__restrict gates_t,
                                   const T *__restrict old_cell, A *__restrict d_cell, T *__restrict d_gates_t) {
    for (int64_t b = 0; b < batch; ++b) {
        const T *__restrict gi = gates_t + b * 3 * state, *__restrict go = gi + state, *__restrict gc = go + state;
        T *__restrict di = d_gates_t + b * 3 * state, *__restrict d_o = di + state, *__restrict dc = d_o + state;
        const A *__restrict r = rec + b * ld;
        A *__restrict carried = d_cell + b * state;
        for (int64_t j = 0; j < state; ++j) {
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

// How a call's batch is split among threads.  Row b of every step reads only row b of the
// step before (h_{t-1}[b] forward, d_gates[t + 1][b] backward), so each part runs the whole
// sequence for its rows with no synchronisation between parts.  Parts are whole register
// tiles (kRows rows), at most one per thread, and each has at least kMinPartWork
// multiply-adds: waking a worker costs microseconds.
constexpr double kMinPartWork = double(1 << 18);

struct Split {
    int64_t tiles, parts, rows_per_part;  // rows_per_part: a multiple of kRows
    Split(int64_t batch, double work_per_row) {
        tiles = (batch + kRows - 1) / kRows;
        const double by_work = std::min(std::max(1.0, work_per_row * double(batch) / kMinPartWork), 1e9);
        parts = std::min({prl::cpu_threads(), tiles, int64_t(by_work)});
        rows_per_part = kRows * ((tiles + parts - 1) / parts);
    }
    // the first row of part p and its row count
    void rows(int64_t p, int64_t batch, int64_t &first, int64_t &count) const {
        first = kRows * (p * tiles / parts);
        count = std::min(kRows * ((p + 1) * tiles / parts), batch) - first;
    }
};

template <typename T>
void forward(T *gates, const T *w_h, int64_t ldw, const T *h0, const T *c0, T *output, T *cells, T *c_n,
             int64_t steps, int64_t batch, int64_t state) {
    using A = prl::acc_t<T>;
    const int64_t n = round_up(3 * state, kCols<A>), cell = batch * state;
    std::vector<A> w((size_t)(state * n), A(0));
    for (int64_t g = 0; g < 3 * state; ++g)  // W_h^T, [S, 3S] padded to n columns
        for (int64_t k = 0; k < state; ++k) w[(size_t)(k * n + g)] = prl::load(w_h[g * ldw + k]);
    const Split split(batch, double(steps) * double(3 * state) * double(state));
    const int64_t scratch_per_part = split.rows_per_part * (state + n);  // left, then rec
    std::vector<A> scratch((size_t)(split.parts * scratch_per_part));
    prl::run_parts(split.parts, [&](int64_t p) {
        int64_t first, count;
        split.rows(p, batch, first, count);
        A *left = scratch.data() + p * scratch_per_part, *rec = left + split.rows_per_part * state;
        const int64_t padded = round_up(count, kRows), at = first * state;
        for (int64_t t = 0; t < steps; ++t) {
            pack_rows((t == 0 ? h0 : output + (t - 1) * cell) + at, count, state, left, padded);
            product(left, w.data(), rec, padded, state, n);
            forward_cells<T, A>(count, state, gates + t * 3 * cell + 3 * at, rec, n,
                                (t == 0 ? c0 : cells + (t - 1) * cell) + at, output + t * cell + at,
                                cells + t * cell + at);
        }
        if (c_n != nullptr && steps > 0) {
            const T *last = cells + (steps - 1) * cell + at;
            std::copy(last, last + count * state, c_n + at);
        }
    });
}

template <typename T>
void backward(const T *grad_output, const T *grad_c_n, const T *gates, const T *w_h, int64_t ldw, const T *c0,
              const T *cells, T *d_gates, T *d_h0, T *d_c0, int64_t steps, int64_t batch, int64_t state) {
    using A = prl::acc_t<T>;
    const int64_t n = round_up(state, kCols<A>), cell = batch * state, k = 3 * state;
    std::vector<A> w((size_t)(k * n), A(0));
    for (int64_t g = 0; g < k; ++g)  // W_h, [3S, S] padded to n columns
        for (int64_t j = 0; j < state; ++j) w[(size_t)(g * n + j)] = prl::load(w_h[g * ldw + j]);
    const Split split(batch, double(steps) * double(k) * double(state));
    const int64_t rows = split.rows_per_part, scratch_per_part = rows * (k + n + state);  // left, rec, d_cell
    std::vector<A> scratch((size_t)(split.parts * scratch_per_part));
    prl::run_parts(split.parts, [&](int64_t p) {
        int64_t first, count;
        split.rows(p, batch, first, count);
        A *left = scratch.data() + p * scratch_per_part, *rec = left + rows * k, *d_cell = rec + rows * n;
        const int64_t padded = round_up(count, kRows), at = first * state;
        std::fill(rec, rec + rows * n, A(0));  // the last step gets no gradient from a later one
        for (int64_t i = 0; i < count * state; ++i) d_cell[i] = grad_c_n ? prl::load(grad_c_n[at + i]) : A(0);
        for (int64_t t = steps - 1; t >= 0; --t) {
            if (t + 1 < steps) {
                pack_rows(d_gates + (t + 1) * 3 * cell + 3 * at, count, k, left, padded);
                product(left, w.data(), rec, padded, k, n);
            }
            backward_cells<T, A>(count, state, grad_output + t * cell + at, rec, n, gates + t * 3 * cell + 3 * at,
                                 (t == 0 ? c0 : cells + (t - 1) * cell) + at, d_cell, d_gates + t * 3 * cell + 3 * at);
        }
        // exact: d_cell holds stored values
        for (int64_t i = 0; i < count * state; ++i) d_c0[at + i] = prl::store<T>(d_cell[i]);
        // d_h0 = d_gates[0] W_h
        pack_rows(d_gates + 3 * at, count, k, left, padded);
        product(left, w.data(), rec, padded, k, n);
        for (int64_t b = 0; b < count; ++b)
            for (int64_t j = 0; j < state; ++j) d_h0[at + b * state + j] = prl::store<T>(rec[b * n + j]);
    });
}

}  // namespace

extern "C" PRL_API prl_status prl_lltm_sequence_forward_cpu(void *gates, const void *w_h, int64_t ldw, const void *h0,
                                                            const void *c0, void *output, void *cells, void *c_n,
                                                            int64_t steps, int64_t batch, int64_t state, int dtype) {
    PRL_API_BEGIN
    const char *fn = __func__;
    PRL_TRY(prl::check_sequence_forward_args(fn, gates, w_h, ldw, h0, c0, output, cells, steps, batch, state));
    const int64_t all = steps * batch * state;
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (all == 0) return PRL_SUCCESS;
        forward<T>(static_cast<T *>(gates), static_cast<const T *>(w_h), ldw, static_cast<const T *>(h0),
                   static_cast<const T *>(c0), static_cast<T *>(output), static_cast<T *>(cells),
                   static_cast<T *>(c_n), steps, batch, state);
        return PRL_SUCCESS;
    });
    PRL_API_END
}

extern "C" PRL_API prl_status prl_lltm_sequence_backward_cpu(const void *grad_output, const void *grad_c_n,
                                                             const void *gates, const void *w_h, int64_t ldw,
                                                             const void *c0, const void *cells, void *d_gates,
                                                             void *d_h0, void *d_c0, int64_t steps, int64_t batch,
                                                             int64_t state, int dtype) {
    PRL_API_BEGIN
    const char *fn = __func__;
    PRL_TRY(prl::check_sequence_backward_args(fn, grad_output, gates, w_h, ldw, c0, cells, d_gates, d_h0, d_c0, steps,
                                              batch, state));
    const int64_t all = steps * batch * state;
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (all == 0) return PRL_SUCCESS;
        backward<T>(static_cast<const T *>(grad_output), static_cast<const T *>(grad_c_n),
                    static_cast<const T *>(gates), static_cast<const T *>(w_h), ldw, static_cast<const T *>(c0),
                    static_cast<const T *>(cells), static_cast<T *>(d_gates), static_cast<T *>(d_h0),
                    static_cast<T *>(d_c0), steps, batch, state);
        return PRL_SUCCESS;
    });
    PRL_API_END
}
