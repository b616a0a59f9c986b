// api.cpp - library information, status names and the per-thread error message.
#include <stdio.h>

#include "common.h"

#ifndef PRL_CUDA_ARCHITECTURES
#define PRL_CUDA_ARCHITECTURES ""
#endif

namespace {
thread_local char last_error[1024] = "";
}

namespace prl {

prl_status fail(prl_status status, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, args);
    va_end(args);
    return status;
}

prl_status check_lltm_sizes(const char *fn, int64_t batch, int64_t state) {
    PRL_TRY(check_count(fn, "batch", batch));
    PRL_TRY(check_count(fn, "state", state));
    if (state > 0 && batch > kMaxElements / 3 / state)
        return fail(PRL_ERROR_INVALID_ARGUMENT,
                    "%s: batch * 3 * state is more elements than any buffer can hold (batch=%lld, state=%lld)", fn,
                    (long long)batch, (long long)state);
    return PRL_SUCCESS;
}

}  // namespace prl

extern "C" {

PRL_API int prl_abi_version(void) { return PRL_ABI_VERSION; }

PRL_API int prl_has_cuda(void) {
#if defined(PRL_WITH_CUDA)
    return 1;
#else
    return 0;
#endif
}

PRL_API const char *prl_cuda_architectures(void) { return PRL_CUDA_ARCHITECTURES; }

PRL_API const char *prl_status_string(int status) {
    switch (status) {
        case PRL_SUCCESS: return "PRL_SUCCESS";
        case PRL_ERROR_INVALID_ARGUMENT: return "PRL_ERROR_INVALID_ARGUMENT";
        case PRL_ERROR_UNSUPPORTED_DTYPE: return "PRL_ERROR_UNSUPPORTED_DTYPE";
        case PRL_ERROR_CUDA: return "PRL_ERROR_CUDA";
        case PRL_ERROR_CUDA_NOT_COMPILED: return "PRL_ERROR_CUDA_NOT_COMPILED";
        case PRL_ERROR_INTERNAL: return "PRL_ERROR_INTERNAL";
        default: return "PRL_UNKNOWN_STATUS";
    }
}

PRL_API const char *prl_last_error(void) { return last_error; }

}  // extern "C"
