// lltm.h - the LLTM cell's pointwise math (shared by the CPU loops and the CUDA
// kernels) and the argument checks (shared by both entry points).
//
// gates = X @ W^T + b is [batch, 3*state]: columns [0, S) feed the input gate,
// [S, 2S) the output gate, [2S, 3S) the candidate cell (PyTorch's C++/CUDA extension
// tutorial).  The backward recomputes the activations from `gates` and `old_cell`
// instead of saving them, which halves what the forward must keep alive.
#pragma once

#include <type_traits>

#include "common.h"

namespace prl {

// The cell from its gates' activations: lltm_forward_math's second half, apart for a kernel
// whose threads activate one gate each (the same expressions, so the same bits).
template <typename A>
PRL_HD void lltm_cell_of(A input_gate, A output_gate, A candidate, A old_cell, A &new_h, A &new_cell) {
    new_cell = old_cell + candidate * input_gate;
    new_h = tanh_(new_cell) * output_gate;
}
// Gate `gate` (0: input, 1: output, 2: candidate) activated, as lltm_forward_math does it.
template <typename T, typename A = acc_t<T>> PRL_HD A lltm_activation(int gate, A g) {
    return gate == 2 ? elu(g) : sigmoid<T>(g);
}

// T: the storage type (the activations' precision follows it: scalar.h); the arithmetic is
// acc_t<T>.
template <typename T, typename A = acc_t<T>>
PRL_HD void lltm_forward_math(A g_in, A g_out, A g_cand, A old_cell, A &new_h, A &new_cell) {
    lltm_cell_of<A>(sigmoid<T>(g_in), sigmoid<T>(g_out), elu(g_cand), old_cell, new_h, new_cell);
}

// grad_h, grad_cell: incoming gradients of new_h and new_cell.
template <typename T, typename A = acc_t<T>>
PRL_HD void lltm_backward_math(A grad_h, A grad_cell, A g_in, A g_out, A g_cand, A old_cell,
                               A &d_in, A &d_out, A &d_cand, A &d_old_cell) {
    const A input_gate = sigmoid<T>(g_in), output_gate = sigmoid<T>(g_out), candidate = elu(g_cand);
    const A tanh_cell = tanh_(old_cell + candidate * input_gate);
    const A d_cell = grad_h * output_gate * (A(1) - tanh_cell * tanh_cell) + grad_cell;
    d_old_cell = d_cell;
    d_in = d_cell * candidate * input_gate * (A(1) - input_gate);
    d_out = grad_h * tanh_cell * output_gate * (A(1) - output_gate);
    d_cand = d_cell * input_gate * d_elu<T>(g_cand);
}

// V consecutive columns col..col+V-1 of row `row` of the cell (row < batch,
// col + V <= state); a gates row is 3*state wide.  The CPU loops call it with V = 1,
// the CUDA kernels with V = 16 / sizeof(T) when the sizes and pointers allow.
template <int V, typename T, typename I>
PRL_HD void lltm_forward_cols(I row, I col, I state, const T *gates, const T *old_cell, T *new_h, T *new_cell) {
    using A = acc_t<T>;
    const T *g = gates + row * 3 * state + col;
    const I k = row * state + col;
    const Vec<T, V> gi = load_vec<V>(g), go = load_vec<V>(g + state), gc = load_vec<V>(g + 2 * state),
                    oc = load_vec<V>(old_cell + k);
    Vec<T, V> h, c;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < V; ++j) {
        A hj, cj;
        lltm_forward_math<T>(load(gi.v[j]), load(go.v[j]), load(gc.v[j]), load(oc.v[j]), hj, cj);
        h.v[j] = store<T>(hj);
        c.v[j] = store<T>(cj);
    }
    store_vec<V>(new_h + k, h);
    store_vec<V>(new_cell + k, c);
}

// grad_h / grad_cell may be NULL: a zero gradient.  has_h / has_cell say whether they
// are there: a plain bool on the GPU (a uniform branch), a std::integral_constant on
// the CPU, where a compile-time answer keeps the loop free of branches (vectorisable).
// The gradient of new_h is grad_h plus `parts` more terms, term p of the cell's element
// (row, col) at grad_h_parts[p * part_stride + row * part_row + col] (a product split along its
// inner dimension, whose partial products this adds up), summed in the arithmetic type in the
// order p = 0, 1, ...; `parts` is an int on the GPU, and on the CPU std::integral_constant<int, 0>
// where there are none.  [parts, batch, state] terms: part_stride = batch * state, part_row =
// state; [batch, parts, state] (one strided-batched product's parts of each row side by side):
// part_stride = state, part_row = parts * state.
constexpr int kMaxLltmParts = 64;  // the most terms prl_lltm_backward_parts_* adds to grad_h

template <int V, typename T, typename I, typename FlagH, typename FlagCell, typename Parts = std::integral_constant<int, 0>>
PRL_HD void lltm_backward_cols(I row, I col, I state, const T *grad_h, const T *grad_cell, FlagH has_h,
                               FlagCell has_cell, const T *gates, const T *old_cell, T *d_gates, T *d_old_cell,
                               const T *grad_h_parts = nullptr, Parts parts = {}, I part_stride = 0,
                               I part_row = 0) {
    using A = acc_t<T>;
    const I k = row * state + col, g = row * 3 * state + col;
    const Vec<T, V> gi = load_vec<V>(gates + g), go = load_vec<V>(gates + g + state),
                    gc = load_vec<V>(gates + g + 2 * state), oc = load_vec<V>(old_cell + k);
    Vec<T, V> gh{}, gcell{};
    if (has_h) gh = load_vec<V>(grad_h + k);
    if (has_cell) gcell = load_vec<V>(grad_cell + k);
    A d_h[V];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < V; ++j) d_h[j] = has_h ? load(gh.v[j]) : A(0);
    for (int p = 0; p < int(parts); ++p) {
        const Vec<T, V> term = load_vec<V>(grad_h_parts + p * part_stride + row * part_row + col);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
        for (int j = 0; j < V; ++j) d_h[j] += load(term.v[j]);
    }
    Vec<T, V> di, dout, dc, dcell;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < V; ++j) {
        A a_in, a_out, a_cand, a_cell;
        lltm_backward_math<T>(d_h[j], has_cell ? load(gcell.v[j]) : A(0), load(gi.v[j]),
                              load(go.v[j]), load(gc.v[j]), load(oc.v[j]), a_in, a_out, a_cand, a_cell);
        di.v[j] = store<T>(a_in);
        dout.v[j] = store<T>(a_out);
        dc.v[j] = store<T>(a_cand);
        dcell.v[j] = store<T>(a_cell);
    }
    store_vec<V>(d_gates + g, di);
    store_vec<V>(d_gates + g + state, dout);
    store_vec<V>(d_gates + g + 2 * state, dc);
    store_vec<V>(d_old_cell + k, dcell);
}

inline prl_status check_lltm_forward_args(const char *fn, const void *gates, const void *old_cell,
                                          const void *new_h, const void *new_cell, int64_t batch,
                                          int64_t state) {
    PRL_TRY(check_lltm_sizes(fn, batch, state));
    const int64_t n = batch * state;
    PRL_TRY(check_pointer(fn, "gates", gates, n));
    PRL_TRY(check_pointer(fn, "old_cell", old_cell, n));
    PRL_TRY(check_pointer(fn, "new_h", new_h, n));
    return check_pointer(fn, "new_cell", new_cell, n);
}

// grad_h and grad_cell may be NULL (a zero gradient), and d_bias (not wanted).
inline prl_status check_lltm_backward_args(const char *fn, const void *gates, const void *old_cell,
                                           const void *d_gates, const void *d_old_cell, const void *d_bias,
                                           int64_t batch, int64_t state) {
    PRL_TRY(check_lltm_sizes(fn, batch, state));
    if (d_bias != nullptr && state > kMaxElements / 3)  // with batch == 0, 3 * state is not checked above
        return fail(PRL_ERROR_INVALID_ARGUMENT, "%s: d_bias would hold 3 * state elements, more than any buffer can "
                    "(state=%lld)", fn, (long long)state);
    const int64_t n = batch * state;
    PRL_TRY(check_pointer(fn, "gates", gates, n));
    PRL_TRY(check_pointer(fn, "old_cell", old_cell, n));
    PRL_TRY(check_pointer(fn, "d_gates", d_gates, n));
    return check_pointer(fn, "d_old_cell", d_old_cell, n);
}

// prl_lltm_backward_parts_*: grad_h_parts holds `parts` terms of [batch, state] (NULL when
// there are none); the rest as prl_lltm_backward_* without d_bias.
inline prl_status check_lltm_backward_parts_args(const char *fn, const void *grad_h_parts, int64_t parts,
                                                 const void *gates, const void *old_cell, const void *d_gates,
                                                 const void *d_old_cell, int64_t batch, int64_t state) {
    PRL_TRY(check_lltm_backward_args(fn, gates, old_cell, d_gates, d_old_cell, nullptr, batch, state));
    PRL_TRY(check_count(fn, "parts", parts));
    if (parts > kMaxLltmParts)
        return fail(PRL_ERROR_INVALID_ARGUMENT, "%s: argument 'parts' must be <= %d, got %lld", fn, kMaxLltmParts,
                    (long long)parts);
    const int64_t n = batch * state;
    if (n > 0 && parts > kMaxElements / n)
        return fail(PRL_ERROR_INVALID_ARGUMENT, "%s: grad_h_parts would hold parts * batch * state elements, more "
                    "than any buffer can (parts=%lld, batch=%lld, state=%lld)", fn, (long long)parts,
                    (long long)batch, (long long)state);
    return check_pointer(fn, "grad_h_parts", grad_h_parts, parts * n);
}

// The sizes of a whole-sequence call (prl_lltm_sequence_*): each index the kernels form
// stays below 2^31, and w_h's row stride covers a row.
inline prl_status check_sequence_sizes(const char *fn, int64_t steps, int64_t batch, int64_t state, int64_t ldw) {
    PRL_TRY(check_count(fn, "steps", steps));
    PRL_TRY(check_lltm_sizes(fn, batch, state));
    if (batch * 3 * state >= (int64_t(1) << 31) || steps >= (int64_t(1) << 31))
        return fail(PRL_ERROR_INVALID_ARGUMENT, "%s: steps=%lld, batch * 3 * state=%lld: each must be < 2^31", fn,
                    (long long)steps, (long long)(batch * 3 * state));
    if (ldw < state)
        return fail(PRL_ERROR_INVALID_ARGUMENT, "%s: argument 'ldw' (%lld) must be >= state (%lld)", fn,
                    (long long)ldw, (long long)state);
    return PRL_SUCCESS;
}

// The sizes and buffers of a whole-sequence forward / backward (CPU and CUDA alike).
// w_name: what the entry point calls its weights argument ("w_h", or "weights" where it
// takes the whole [3S, S+I] matrix).
inline prl_status check_sequence_forward_args(const char *fn, const void *gates, const void *w_h, int64_t ldw,
                                              const void *h0, const void *c0, const void *output, const void *cells,
                                              int64_t steps, int64_t batch, int64_t state,
                                              const char *w_name = "w_h") {
    PRL_TRY(check_sequence_sizes(fn, steps, batch, state, ldw));
    const int64_t all = steps * batch * state;
    PRL_TRY(check_pointer(fn, "gates", gates, all));
    PRL_TRY(check_pointer(fn, w_name, w_h, all));
    PRL_TRY(check_pointer(fn, "h0", h0, all));
    PRL_TRY(check_pointer(fn, "c0", c0, all));
    PRL_TRY(check_pointer(fn, "output", output, all));
    return check_pointer(fn, "cells", cells, all);
}

inline prl_status check_sequence_backward_args(const char *fn, const void *grad_output, const void *gates,
                                               const void *w_h, int64_t ldw, const void *c0, const void *cells,
                                               const void *d_gates, const void *d_h0, const void *d_c0,
                                               int64_t steps, int64_t batch, int64_t state) {
    PRL_TRY(check_sequence_sizes(fn, steps, batch, state, ldw));
    const int64_t all = steps * batch * state;
    PRL_TRY(check_pointer(fn, "grad_output", grad_output, all));
    PRL_TRY(check_pointer(fn, "gates", gates, all));
    PRL_TRY(check_pointer(fn, "w_h", w_h, all));
    PRL_TRY(check_pointer(fn, "c0", c0, all));
    PRL_TRY(check_pointer(fn, "cells", cells, all));
    PRL_TRY(check_pointer(fn, "d_gates", d_gates, all));
    PRL_TRY(check_pointer(fn, "d_h0", d_h0, all));
    return check_pointer(fn, "d_c0", d_c0, all);
}

}  // namespace prl
