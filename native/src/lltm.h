// lltm.h - the LLTM cell's pointwise math (shared by the CPU loops and the CUDA
// kernels) and the argument checks (shared by both entry points).
//
// gates = X @ W^T + b is [batch, 3*state]: columns [0, S) feed the input gate,
// [S, 2S) the output gate, [2S, 3S) the candidate cell (PyTorch's C++/CUDA extension
// tutorial).  The backward recomputes the activations from `gates` and `old_cell`
// instead of saving them, which halves what the forward must keep alive.
#pragma once

#include "common.h"

namespace prl {

template <typename A>
PRL_HD void lltm_forward_math(A g_in, A g_out, A g_cand, A old_cell, A &new_h, A &new_cell) {
    const A input_gate = sigmoid(g_in), output_gate = sigmoid(g_out), candidate = elu(g_cand);
    new_cell = old_cell + candidate * input_gate;
    new_h = tanh_(new_cell) * output_gate;
}

// grad_h, grad_cell: incoming gradients of new_h and new_cell.
template <typename A>
PRL_HD void lltm_backward_math(A grad_h, A grad_cell, A g_in, A g_out, A g_cand, A old_cell,
                               A &d_in, A &d_out, A &d_cand, A &d_old_cell) {
    const A input_gate = sigmoid(g_in), output_gate = sigmoid(g_out), candidate = elu(g_cand);
    const A tanh_cell = tanh_(old_cell + candidate * input_gate);
    const A d_cell = grad_h * output_gate * (A(1) - tanh_cell * tanh_cell) + grad_cell;
    d_old_cell = d_cell;
    d_in = d_cell * candidate * input_gate * (A(1) - input_gate);
    d_out = grad_h * tanh_cell * output_gate * (A(1) - output_gate);
    d_cand = d_cell * input_gate * d_elu(g_cand);
}

// Element (row, col) of the cell, row < batch, col < state; the gates row is 3*state wide.
template <typename T, typename I>
PRL_HD void lltm_forward_element(I row, I col, I state, const T *gates, const T *old_cell, T *new_h,
                                 T *new_cell) {
    using A = acc_t<T>;
    const T *g = gates + row * 3 * state + col;
    const I k = row * state + col;
    A h, c;
    lltm_forward_math<A>(load(g[0]), load(g[state]), load(g[2 * state]), load(old_cell[k]), h, c);
    new_h[k] = store<T>(h);
    new_cell[k] = store<T>(c);
}

template <typename T, typename I>
PRL_HD void lltm_backward_element(I row, I col, I state, const T *grad_h, const T *grad_cell,
                                  const T *gates, const T *old_cell, T *d_gates, T *d_old_cell) {
    using A = acc_t<T>;
    const I k = row * state + col, g = row * 3 * state + col;
    const A gh = grad_h ? load(grad_h[k]) : A(0);
    const A gc = grad_cell ? load(grad_cell[k]) : A(0);
    A d_in, d_out, d_cand, d_cell;
    lltm_backward_math<A>(gh, gc, load(gates[g]), load(gates[g + state]), load(gates[g + 2 * state]),
                          load(old_cell[k]), d_in, d_out, d_cand, d_cell);
    d_gates[g] = store<T>(d_in);
    d_gates[g + state] = store<T>(d_out);
    d_gates[g + 2 * state] = store<T>(d_cand);
    d_old_cell[k] = store<T>(d_cell);
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

// grad_h and grad_cell may be NULL (a zero gradient).
inline prl_status check_lltm_backward_args(const char *fn, const void *gates, const void *old_cell,
                                           const void *d_gates, const void *d_old_cell, int64_t batch,
                                           int64_t state) {
    PRL_TRY(check_lltm_sizes(fn, batch, state));
    const int64_t n = batch * state;
    PRL_TRY(check_pointer(fn, "gates", gates, n));
    PRL_TRY(check_pointer(fn, "old_cell", old_cell, n));
    PRL_TRY(check_pointer(fn, "d_gates", d_gates, n));
    return check_pointer(fn, "d_old_cell", d_old_cell, n);
}

}  // namespace prl
