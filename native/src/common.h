// common.h - what every entry point shares: the error state, the exception barrier,
// argument checks and the dtype dispatch.  Host code only.
#pragma once

#include <stdarg.h>
#include <stdint.h>

#include <exception>

#include "pyroundlib.h"
#include "scalar.h"

// The CPU loops are built three times, for AVX-512 (x86-64-v4), AVX2+FMA (x86-64-v3) and
// the x86-64 baseline; the dynamic loader picks one per machine (GCC function
// multi-versioning, an ifunc).  The math they call must be always_inline (PRL_HD): a
// plain inline function is not inlined into the AVX-512 clone, which then calls it per
// element, unvectorised, 5x slower.  CMake defines PRL_CPU_MULTIVERSION for the C++
// sources only where its check of target_clones passed (GCC on an ELF x86-64 target, e.g.
// Linux; not Windows, which has no ifunc) and PYROUNDLIB_CPU_MULTIVERSION is ON; elsewhere
// the baseline loops alone are built.  `make sanitize` builds those
// (-DPYROUNDLIB_CPU_MULTIVERSION=OFF), so the tests cover them too.
#if defined(PRL_CPU_MULTIVERSION)
#define PRL_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define PRL_CPU_CLONES
#endif

namespace prl {

// No buffer holds more elements than this (its byte size, at 8 bytes an element, must fit in int64_t).
constexpr int64_t kMaxElements = INT64_MAX / 8;

// Record a failure for prl_last_error() (thread-local) and return its status.
prl_status fail(prl_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

inline prl_status check_count(const char *fn, const char *arg, int64_t value) {
    if (value < 0)
        return fail(PRL_ERROR_INVALID_ARGUMENT, "%s: argument '%s' must be >= 0, got %lld", fn, arg,
                    (long long)value);
    return PRL_SUCCESS;
}

inline prl_status check_pointer(const char *fn, const char *arg, const void *p, int64_t n) {
    if (p == nullptr && n > 0)
        return fail(PRL_ERROR_INVALID_ARGUMENT, "%s: argument '%s' is NULL but %lld elements were requested",
                    fn, arg, (long long)n);
    return PRL_SUCCESS;
}

// batch * 3 * state (the largest buffer an LLTM call indexes) must not exceed kMaxElements.
prl_status check_lltm_sizes(const char *fn, int64_t batch, int64_t state);

template <typename T> struct type_tag { using type = T; };

// Calls f(type_tag<T>{}) with T the storage type of `dtype`.
template <typename F> prl_status dispatch_dtype(const char *fn, int dtype, F &&f) {
    switch (dtype) {
        case PRL_FLOAT32: return f(type_tag<float>{});
        case PRL_FLOAT64: return f(type_tag<double>{});
        case PRL_FLOAT16: return f(type_tag<half_t>{});
        case PRL_BFLOAT16: return f(type_tag<bfloat16_t>{});
        default:
            return fail(PRL_ERROR_UNSUPPORTED_DTYPE,
                        "%s: argument 'dtype' is %d, not a prl_dtype code (0 float32, 1 float64, "
                        "2 float16, 3 bfloat16)", fn, dtype);
    }
}

}  // namespace prl

#define PRL_TRY(expr)                                   \
    do {                                                \
        const prl_status prl_try_status_ = (expr);      \
        if (prl_try_status_ != PRL_SUCCESS) return prl_try_status_; \
    } while (0)

// The exception barrier around every exported function body: nothing thrown inside
// (std::bad_alloc, a bug) crosses the C ABI; it becomes PRL_ERROR_INTERNAL.
#define PRL_API_BEGIN try {
#define PRL_API_END                                                                          \
    }                                                                                        \
    catch (const std::exception &e) {                                                        \
        return prl::fail(PRL_ERROR_INTERNAL, "%s: unexpected C++ exception: %s", __func__, e.what()); \
    }                                                                                        \
    catch (...) {                                                                            \
        return prl::fail(PRL_ERROR_INTERNAL, "%s: unexpected unknown C++ exception", __func__); \
    }
