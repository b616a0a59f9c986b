// lltm_cuda.cu - prl_lltm_forward_cuda, prl_lltm_backward_cuda.
//
// One thread per element of the [batch, state] cell, in a grid-stride loop.  The
// row/column split costs a division per element: 32-bit when every index fits
// (the usual case), 64-bit otherwise.
#include <limits>

#include "cuda_common.cuh"
#include "lltm.h"

namespace {

template <typename T, typename I>
__global__ void lltm_forward_kernel(const T *__restrict__ gates, const T *__restrict__ old_cell, T *__restrict__ new_h,
                                    T *__restrict__ new_cell, I n, I state) {
    PRL_CUDA_KERNEL_LOOP_TYPE(k, n, I) {
        const I row = k / state;
        prl::lltm_forward_element<T, I>(row, k - row * state, state, gates, old_cell, new_h, new_cell);
    }
}

template <typename T, typename I>
__global__ void lltm_backward_kernel(const T *__restrict__ grad_h, const T *__restrict__ grad_cell,
                                     const T *__restrict__ gates, const T *__restrict__ old_cell,
                                     T *__restrict__ d_gates, T *__restrict__ d_old_cell, I n, I state) {
    PRL_CUDA_KERNEL_LOOP_TYPE(k, n, I) {
        const I row = k / state;
        prl::lltm_backward_element<T, I>(row, k - row * state, state, grad_h, grad_cell, gates, old_cell, d_gates,
                                         d_old_cell);
    }
}

// 32-bit indexing is safe when the largest index (3n) plus one grid stride stays below 2^32.
inline bool fits_uint32(int64_t n, int device) {
    const int64_t stride = (int64_t)prl::cuda_blocks(n, device) * prl::kCudaNumThreads;
    return 3 * n + stride < (int64_t)std::numeric_limits<uint32_t>::max();
}

}  // namespace

extern "C" PRL_API prl_status prl_lltm_forward_cuda(const void *gates, const void *old_cell, void *new_h,
                                                    void *new_cell, int64_t batch, int64_t state, int dtype,
                                                    int device, void *stream) {
    PRL_API_BEGIN
    const char *fn = __func__;
    PRL_TRY(prl::check_lltm_forward_args(fn, gates, old_cell, new_h, new_cell, batch, state));
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        const int64_t n = batch * state;
        if (n == 0) return PRL_SUCCESS;
        return prl::cuda_launch(fn, device, [&](int dev) {
            const unsigned int blocks = prl::cuda_blocks(n, dev);
            auto s = static_cast<cudaStream_t>(stream);
            auto g = static_cast<const T *>(gates);
            auto c = static_cast<const T *>(old_cell);
            if (fits_uint32(n, dev))
                lltm_forward_kernel<T, uint32_t><<<blocks, prl::kCudaNumThreads, 0, s>>>(
                    g, c, static_cast<T *>(new_h), static_cast<T *>(new_cell), (uint32_t)n, (uint32_t)state);
            else
                lltm_forward_kernel<T, int64_t><<<blocks, prl::kCudaNumThreads, 0, s>>>(
                    g, c, static_cast<T *>(new_h), static_cast<T *>(new_cell), n, state);
        });
    });
    PRL_API_END
}

extern "C" PRL_API prl_status prl_lltm_backward_cuda(const void *grad_h, const void *grad_cell, const void *gates,
                                                     const void *old_cell, void *d_gates, void *d_old_cell,
                                                     int64_t batch, int64_t state, int dtype, int device,
                                                     void *stream) {
    PRL_API_BEGIN
    const char *fn = __func__;
    PRL_TRY(prl::check_lltm_backward_args(fn, gates, old_cell, d_gates, d_old_cell, batch, state));
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        const int64_t n = batch * state;
        if (n == 0) return PRL_SUCCESS;
        return prl::cuda_launch(fn, device, [&](int dev) {
            const unsigned int blocks = prl::cuda_blocks(n, dev);
            auto s = static_cast<cudaStream_t>(stream);
            auto gh = static_cast<const T *>(grad_h);
            auto gc = static_cast<const T *>(grad_cell);
            auto g = static_cast<const T *>(gates);
            auto c = static_cast<const T *>(old_cell);
            if (fits_uint32(n, dev))
                lltm_backward_kernel<T, uint32_t><<<blocks, prl::kCudaNumThreads, 0, s>>>(
                    gh, gc, g, c, static_cast<T *>(d_gates), static_cast<T *>(d_old_cell), (uint32_t)n,
                    (uint32_t)state);
            else
                lltm_backward_kernel<T, int64_t><<<blocks, prl::kCudaNumThreads, 0, s>>>(
                    gh, gc, g, c, static_cast<T *>(d_gates), static_cast<T *>(d_old_cell), n, state);
        });
    });
    PRL_API_END
}
