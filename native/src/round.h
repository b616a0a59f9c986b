// round.h - the round op: its per-element function (shared by the CPU loop and the
// CUDA kernel) and its argument checks (shared by both entry points).
#pragma once

#include "common.h"

namespace prl {

// Round half to even in the arithmetic type.  For float16/bfloat16 the float result
// is an integer the storage type holds exactly, so the final store is exact too.
template <typename T> PRL_HD T round_element(T x) { return store_integral<T>(rint_(load(x))); }

inline prl_status check_round_args(const char *fn, const void *x, const void *y, int64_t n) {
    PRL_TRY(check_count(fn, "n", n));
    if (n > kMaxElements)
        return fail(PRL_ERROR_INVALID_ARGUMENT, "%s: argument 'n' is %lld, more elements than any buffer can hold",
                    fn, (long long)n);
    PRL_TRY(check_pointer(fn, "x", x, n));
    return check_pointer(fn, "y", y, n);
}

}  // namespace prl
