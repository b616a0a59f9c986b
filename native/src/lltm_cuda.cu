// lltm_cuda.cu - prl_lltm_forward_cuda, prl_lltm_backward_cuda.
//
// The grid-stride loop runs over groups of V consecutive columns of the [batch, state]
// cell: V = 16 / sizeof(T) (one 16-byte access per operand) when state is a multiple
// of V and every buffer is 16-byte aligned, else V = 1.  The row/column split costs a
// division per group: 32-bit when every index fits (the usual case), else 64-bit.
#include <limits>

#include "cuda_common.cuh"
#include "lltm.h"

namespace {

template <typename T, int V, typename I>
__global__ void lltm_forward_kernel(const T *__restrict__ gates, const T *__restrict__ old_cell, T *__restrict__ new_h,
                                    T *__restrict__ new_cell, I groups, I state) {
    const I groups_per_row = state / V;
    PRL_CUDA_KERNEL_LOOP_TYPE(k, groups, I) {
        const I row = k / groups_per_row;
        prl::lltm_forward_cols<V, T, I>(row, (k - row * groups_per_row) * V, state, gates, old_cell, new_h, new_cell);
    }
}

template <typename T, int V, typename I>
__global__ void lltm_backward_kernel(const T *__restrict__ grad_h, const T *__restrict__ grad_cell,
                                     const T *__restrict__ gates, const T *__restrict__ old_cell,
                                     T *__restrict__ d_gates, T *__restrict__ d_old_cell, I groups, I state) {
    const I groups_per_row = state / V;
    PRL_CUDA_KERNEL_LOOP_TYPE(k, groups, I) {
        const I row = k / groups_per_row;
        prl::lltm_backward_cols<V, T, I>(row, (k - row * groups_per_row) * V, state, grad_h, grad_cell,
                                         grad_h != nullptr, grad_cell != nullptr, gates, old_cell, d_gates,
                                         d_old_cell);
    }
}

// Picks the vector width V and the index type I, then calls launch(kernel_tag<V, I>{}, groups).
template <int V, typename I> struct kernel_tag {
    static constexpr int vec = V;
    using index = I;
};

template <typename T, typename Launch>
void dispatch_lltm(int64_t batch, int64_t state, bool all_aligned, Launch &&launch) {
    constexpr int V = prl::kVec16<T>;
    const bool vectorise = all_aligned && state % V == 0;
    const int64_t groups = batch * state / (vectorise ? V : 1);
    // 32-bit indices are safe while the largest index (3 * batch * state) plus one grid
    // stride (at most 2^28 threads) stays below 2^32.
    const bool small = 3 * batch * state < (int64_t(1) << 32) - (int64_t(1) << 29);
    if (vectorise && small) launch(kernel_tag<V, uint32_t>{}, groups);
    else if (vectorise) launch(kernel_tag<V, int64_t>{}, groups);
    else if (small) launch(kernel_tag<1, uint32_t>{}, groups);
    else launch(kernel_tag<1, int64_t>{}, groups);
}

bool all_aligned16(std::initializer_list<const void *> pointers) {
    for (const void *p : pointers)
        if (p != nullptr && !prl::aligned16(p)) return false;
    return true;
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
        if (batch * state == 0) return PRL_SUCCESS;
        return prl::cuda_launch(fn, device, [&] {
            const bool aligned = all_aligned16({gates, old_cell, new_h, new_cell});
            dispatch_lltm<T>(batch, state, aligned, [&](auto tag, int64_t groups) {
                using I = typename decltype(tag)::index;
                lltm_forward_kernel<T, decltype(tag)::vec, I>
                    <<<prl::cuda_blocks(groups), prl::kCudaNumThreads, 0, static_cast<cudaStream_t>(stream)>>>(
                        static_cast<const T *>(gates), static_cast<const T *>(old_cell), static_cast<T *>(new_h),
                        static_cast<T *>(new_cell), (I)groups, (I)state);
            });
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
        if (batch * state == 0) return PRL_SUCCESS;
        return prl::cuda_launch(fn, device, [&] {
            const bool aligned = all_aligned16({grad_h, grad_cell, gates, old_cell, d_gates, d_old_cell});
            dispatch_lltm<T>(batch, state, aligned, [&](auto tag, int64_t groups) {
                using I = typename decltype(tag)::index;
                lltm_backward_kernel<T, decltype(tag)::vec, I>
                    <<<prl::cuda_blocks(groups), prl::kCudaNumThreads, 0, static_cast<cudaStream_t>(stream)>>>(
                        static_cast<const T *>(grad_h), static_cast<const T *>(grad_cell),
                        static_cast<const T *>(gates), static_cast<const T *>(old_cell), static_cast<T *>(d_gates),
                        static_cast<T *>(d_old_cell), (I)groups, (I)state);
            });
        });
    });
    PRL_API_END
}
