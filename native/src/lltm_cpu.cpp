// lltm_cpu.cpp - prl_lltm_forward_cpu, prl_lltm_backward_cpu.
#include "lltm.h"

extern "C" PRL_API prl_status prl_lltm_forward_cpu(const void *gates, const void *old_cell, void *new_h,
                                                   void *new_cell, int64_t batch, int64_t state,
                                                   int dtype) {
    PRL_API_BEGIN
    const char *fn = __func__;
    PRL_TRY(prl::check_lltm_forward_args(fn, gates, old_cell, new_h, new_cell, batch, state));
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        for (int64_t row = 0; row < batch; ++row)
            for (int64_t col = 0; col < state; ++col)
                prl::lltm_forward_cols<1, T, int64_t>(row, col, state, static_cast<const T *>(gates),
                                                      static_cast<const T *>(old_cell), static_cast<T *>(new_h),
                                                      static_cast<T *>(new_cell));
        return PRL_SUCCESS;
    });
    PRL_API_END
}

extern "C" PRL_API prl_status prl_lltm_backward_cpu(const void *grad_h, const void *grad_cell, const void *gates,
                                                    const void *old_cell, void *d_gates, void *d_old_cell,
                                                    int64_t batch, int64_t state, int dtype) {
    PRL_API_BEGIN
    const char *fn = __func__;
    PRL_TRY(prl::check_lltm_backward_args(fn, gates, old_cell, d_gates, d_old_cell, batch, state));
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        for (int64_t row = 0; row < batch; ++row)
            for (int64_t col = 0; col < state; ++col)
                prl::lltm_backward_cols<1, T, int64_t>(
                    row, col, state, static_cast<const T *>(grad_h), static_cast<const T *>(grad_cell),
                    static_cast<const T *>(gates), static_cast<const T *>(old_cell), static_cast<T *>(d_gates),
                    static_cast<T *>(d_old_cell));
        return PRL_SUCCESS;
    });
    PRL_API_END
}
