// lltm_cpu.cpp - prl_lltm_forward_cpu, prl_lltm_backward_cpu, prl_lltm_backward_parts_cpu.
//
// Plain row/column loops over the per-column functions of lltm.h (V = 1).  The inner
// loop has no branches and its pointers are __restrict (the ABI forbids overlapping
// buffers), so GCC vectorises it (see also the CPU flags in CMakeLists.txt).  The rows
// [first, last) of a call are split into chunks among up to prl_cpu_threads() threads
// (prl::run_chunks); d_bias is then summed afterwards, its columns split among the threads,
// each column over all rows in row order, the order of the one-thread loop, which sums each
// row as it finishes: every result is the same at any thread count.
#include <type_traits>
#include <vector>

#include "cpu_threads.h"
#include "lltm.h"

namespace {

// Rows per chunk: about prl::kGrain elements of state.
int64_t row_grain(int64_t state) { return std::max<int64_t>(1, prl::kGrain / std::max<int64_t>(state, 1)); }

template <typename T>
PRL_CPU_CLONES void forward_rows(int64_t first, int64_t last, int64_t state, const T *__restrict gates,
                                 const T *__restrict old_cell, T *__restrict new_h, T *__restrict new_cell) {
    for (int64_t row = first; row < last; ++row)
        for (int64_t col = 0; col < state; ++col)
            prl::lltm_forward_cols<1, T, int64_t>(row, col, state, gates, old_cell, new_h, new_cell);
}

// has_h / has_cell: std::true_type or std::false_type, so no branch is left in the loop.
// sums (3*state accumulators, or NULL): each finished row of d_gates is added to them while
// it is still in L1, in row order (a call on one thread; split, column_sums adds them after).
template <typename T, typename FlagH, typename FlagCell>
PRL_CPU_CLONES void backward_rows(int64_t first, int64_t last, int64_t state, const T *__restrict grad_h,
                                  const T *__restrict grad_cell, FlagH has_h, FlagCell has_cell,
                                  const T *__restrict gates, const T *__restrict old_cell, T *__restrict d_gates,
                                  T *__restrict d_old_cell, prl::acc_t<T> *__restrict sums) {
    for (int64_t row = first; row < last; ++row) {
        for (int64_t col = 0; col < state; ++col)
            prl::lltm_backward_cols<1, T, int64_t>(row, col, state, grad_h, grad_cell, has_h, has_cell, gates,
                                                   old_cell, d_gates, d_old_cell);
        if (sums != nullptr) {
            const T *__restrict d_row = d_gates + row * 3 * state;
            for (int64_t c = 0; c < 3 * state; ++c) sums[c] += prl::load(d_row[c]);
        }
    }
}

// sums[c] = the sum of d_gates[row][c] over all rows, in row order, for c in [first, last).
template <typename T>
PRL_CPU_CLONES void column_sums(int64_t first, int64_t last, int64_t batch, int64_t width, const T *__restrict d_gates,
                                prl::acc_t<T> *__restrict sums) {
    for (int64_t row = 0; row < batch; ++row) {
        const T *__restrict d_row = d_gates + row * width;
        for (int64_t c = first; c < last; ++c) sums[c] += prl::load(d_row[c]);
    }
}

// grad_h plus `parts` terms (parts >= 1), part_stride = batch * state apart.
template <typename T, typename FlagH, typename FlagCell>
PRL_CPU_CLONES void backward_parts_rows(int64_t first, int64_t last, int64_t batch, int64_t state,
                                        const T *__restrict grad_h, const T *__restrict grad_h_parts, int parts,
                                        const T *__restrict grad_cell, FlagH has_h, FlagCell has_cell,
                                        const T *__restrict gates, const T *__restrict old_cell,
                                        T *__restrict d_gates, T *__restrict d_old_cell) {
    for (int64_t row = first; row < last; ++row)
        for (int64_t col = 0; col < state; ++col)
            prl::lltm_backward_cols<1, T, int64_t>(row, col, state, grad_h, grad_cell, has_h, has_cell, gates,
                                                   old_cell, d_gates, d_old_cell, grad_h_parts, parts, batch * state,
                                                   state);
}

// Calls rows(has_h, has_cell) with std::true_type / std::false_type for whether grad_h and
// grad_cell are given, so each combination gets a loop without branches.
template <typename Rows>
void with_gradient_flags(const void *grad_h, const void *grad_cell, Rows &&rows) {
    using yes = std::true_type;
    using no = std::false_type;
    if (grad_h && grad_cell) rows(yes{}, yes{});
    else if (grad_h) rows(yes{}, no{});
    else if (grad_cell) rows(no{}, yes{});
    else rows(no{}, no{});
}

}  // namespace

extern "C" PRL_API prl_status prl_lltm_forward_cpu(const void *gates, const void *old_cell, void *new_h,
                                                   void *new_cell, int64_t batch, int64_t state, int dtype) {
    PRL_API_BEGIN
    const char *fn = __func__;
    PRL_TRY(prl::check_lltm_forward_args(fn, gates, old_cell, new_h, new_cell, batch, state));
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        prl::run_chunks(batch, row_grain(state), [&](int64_t first, int64_t last) {
            forward_rows<T>(first, last, state, static_cast<const T *>(gates), static_cast<const T *>(old_cell),
                            static_cast<T *>(new_h), static_cast<T *>(new_cell));
        });
        return PRL_SUCCESS;
    });
    PRL_API_END
}

extern "C" PRL_API prl_status prl_lltm_backward_cpu(const void *grad_h, const void *grad_cell, const void *gates,
                                                    const void *old_cell, void *d_gates, void *d_old_cell,
                                                    void *d_bias, int64_t batch, int64_t state, int dtype) {
    PRL_API_BEGIN
    const char *fn = __func__;
    PRL_TRY(prl::check_lltm_backward_args(fn, gates, old_cell, d_gates, d_old_cell, d_bias, batch, state));
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        std::vector<prl::acc_t<T>> sums(d_bias != nullptr ? 3 * state : 0);  // bad_alloc: PRL_ERROR_INTERNAL
        const int64_t grain = row_grain(state);
        const bool split = batch > grain && prl::cpu_threads() > 1;
        auto rows = [&](auto has_h, auto has_cell) {
            prl::run_chunks(batch, grain, [&](int64_t first, int64_t last) {
                backward_rows<T>(first, last, state, static_cast<const T *>(grad_h),
                                 static_cast<const T *>(grad_cell), has_h, has_cell, static_cast<const T *>(gates),
                                 static_cast<const T *>(old_cell), static_cast<T *>(d_gates),
                                 static_cast<T *>(d_old_cell), d_bias != nullptr && !split ? sums.data() : nullptr);
            });
        };
        with_gradient_flags(grad_h, grad_cell, rows);
        if (d_bias == nullptr) return PRL_SUCCESS;
        if (split) {
            const int64_t width = 3 * state, column_grain = std::max<int64_t>(64, prl::kGrain / batch);
            prl::run_chunks(width, column_grain, [&](int64_t first, int64_t last) {
                column_sums<T>(first, last, batch, width, static_cast<const T *>(d_gates), sums.data());
            });
        }
        T *bias_out = static_cast<T *>(d_bias);
        for (size_t c = 0; c < sums.size(); ++c) bias_out[c] = prl::store<T>(sums[c]);
        return PRL_SUCCESS;
    });
    PRL_API_END
}

extern "C" PRL_API prl_status prl_lltm_backward_parts_cpu(const void *grad_h, const void *grad_h_parts, int64_t parts,
                                                          const void *grad_cell, const void *gates,
                                                          const void *old_cell, void *d_gates, void *d_old_cell,
                                                          int64_t batch, int64_t state, int dtype) {
    PRL_API_BEGIN
    const char *fn = __func__;
    PRL_TRY(prl::check_lltm_backward_parts_args(fn, grad_h_parts, parts, gates, old_cell, d_gates, d_old_cell, batch,
                                                state));
    if (parts == 0) return prl_lltm_backward_cpu(grad_h, grad_cell, gates, old_cell, d_gates, d_old_cell, nullptr,
                                                 batch, state, dtype);
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        auto rows = [&](auto has_h, auto has_cell) {
            prl::run_chunks(batch, row_grain(state), [&](int64_t first, int64_t last) {
                backward_parts_rows<T>(first, last, batch, state, static_cast<const T *>(grad_h),
                                       static_cast<const T *>(grad_h_parts), (int)parts,
                                       static_cast<const T *>(grad_cell), has_h, has_cell,
                                       static_cast<const T *>(gates), static_cast<const T *>(old_cell),
                                       static_cast<T *>(d_gates), static_cast<T *>(d_old_cell));
            });
        };
        with_gradient_flags(grad_h, grad_cell, rows);
        return PRL_SUCCESS;
    });
    PRL_API_END
}
