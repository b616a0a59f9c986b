// round_cuda.cu - prl_round_cuda.
#include "cuda_common.cuh"
#include "round.h"

namespace {
template <typename T> __global__ void round_kernel(const T *__restrict__ x, T *__restrict__ y, int64_t n) {
    PRL_CUDA_KERNEL_LOOP(i, n) { y[i] = prl::round_element(x[i]); }
}
}  // namespace

extern "C" PRL_API prl_status prl_round_cuda(const void *x, void *y, int64_t n, int dtype, int device,
                                             void *stream) {
    PRL_API_BEGIN
    const char *fn = __func__;
    PRL_TRY(prl::check_round_args(fn, x, y, n));
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (n == 0) return PRL_SUCCESS;
        return prl::cuda_launch(fn, device, [&](int dev) {
            round_kernel<T><<<prl::cuda_blocks(n, dev), prl::kCudaNumThreads, 0, static_cast<cudaStream_t>(stream)>>>(
                static_cast<const T *>(x), static_cast<T *>(y), n);
        });
    });
    PRL_API_END
}
