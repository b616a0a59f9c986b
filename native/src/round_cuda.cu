// round_cuda.cu - prl_round_cuda.
//
// Each thread of the grid-stride loop rounds V consecutive elements moved as one
// 16-byte access (V = 4 floats, 8 halves, 2 doubles) when both buffers are 16-byte
// aligned, else one element (V = 1).  The n % V tail is left to the first threads.
#include "cuda_common.cuh"
#include "round.h"

namespace {
template <typename T, int V> __global__ void round_kernel(const T *x, T *y, int64_t n) {  // x == y is allowed
    const int64_t groups = n / V;
    PRL_CUDA_KERNEL_LOOP(i, groups) {
        prl::Vec<T, V> v = prl::load_vec<V>(x + i * V);
#pragma unroll
        for (int j = 0; j < V; ++j) v.v[j] = prl::round_element(v.v[j]);
        prl::store_vec<V>(y + i * V, v);
    }
    if (V > 1) {  // the last n % V elements
        const int64_t tail = groups * V + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
        if (tail < n) y[tail] = prl::round_element(x[tail]);
    }
}

template <typename T, int V> void launch_round(const T *x, T *y, int64_t n, cudaStream_t stream) {
    round_kernel<T, V><<<prl::cuda_blocks(n / V > 0 ? n / V : 1), prl::kCudaNumThreads, 0, stream>>>(x, y, n);
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
        return prl::cuda_launch(fn, device, [&] {
            auto s = static_cast<cudaStream_t>(stream);
            if (prl::aligned16(x) && prl::aligned16(y))
                launch_round<T, prl::kVec16<T>>(static_cast<const T *>(x), static_cast<T *>(y), n, s);
            else
                launch_round<T, 1>(static_cast<const T *>(x), static_cast<T *>(y), n, s);
        });
    });
    PRL_API_END
}
