// round_cpu.cpp - prl_round_cpu.
#include "round.h"

namespace {
template <typename T> PRL_CPU_CLONES void round_cpu(const T *x, T *y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = prl::round_element(x[i]);
}
}  // namespace

extern "C" PRL_API prl_status prl_round_cpu(const void *x, void *y, int64_t n, int dtype) {
    PRL_API_BEGIN
    const char *fn = __func__;
    PRL_TRY(prl::check_round_args(fn, x, y, n));
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        round_cpu(static_cast<const T *>(x), static_cast<T *>(y), n);
        return PRL_SUCCESS;
    });
    PRL_API_END
}
