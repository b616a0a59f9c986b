// round_cuda.cu - prl_round_cuda.
//
// Each thread of the grid-stride loop rounds groups of V consecutive elements, each
// group moved as one 16-byte access (V = 4 floats, 8 halves, 2 doubles) when both
// buffers are 16-byte aligned, else one element (V = 1); and it handles kUnroll such
// groups per iteration, loaded before any is used.  The n % V tail is left to the
// first threads.
#include "cuda_common.cuh"
#include "round.h"

namespace {
constexpr int kUnroll = 4;

template <typename T, int V> __global__ void round_kernel(const T *x, T *y, int64_t n) {  // x == y is allowed
    const int64_t groups = n / V, stride = prl::grid_stride();
    PRL_CUDA_KERNEL_LOOP_UNROLLED(i, groups, kUnroll) {
        prl::Vec<T, V> v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
            if (i + u * stride < groups) v[u] = prl::load_vec<V>(x + (i + u * stride) * V);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            if (i + u * stride < groups) {
#pragma unroll
                for (int j = 0; j < V; ++j) v[u].v[j] = prl::round_element(v[u].v[j]);
                prl::store_vec<V>(y + (i + u * stride) * V, v[u]);
            }
        }
    }
    if (V > 1) {
        const int64_t tail = groups * V + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
        if (tail < n) y[tail] = prl::round_element(x[tail]);
    }
}

template <typename T, int V> void launch_round(const T *x, T *y, int64_t n, int device, cudaStream_t stream) {
    const int64_t threads_needed = (n / V + kUnroll - 1) / kUnroll;
    const unsigned int blocks = prl::cuda_blocks<round_kernel<T, V>>(threads_needed > 0 ? threads_needed : 1, device);
    round_kernel<T, V><<<blocks, prl::kCudaNumThreads, 0, stream>>>(x, y, n);
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
            auto s = static_cast<cudaStream_t>(stream);
            if (prl::aligned16(x) && prl::aligned16(y))
                launch_round<T, prl::kVec16<T>>(static_cast<const T *>(x), static_cast<T *>(y), n, dev, s);
            else
                launch_round<T, 1>(static_cast<const T *>(x), static_cast<T *>(y), n, dev, s);
        });
    });
    PRL_API_END
}
