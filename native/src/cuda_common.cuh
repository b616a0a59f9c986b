// cuda_common.cuh - Caffe's kernel idiom with today's fixes, and the launch wrapper
// every CUDA entry point goes through (device guard, launch-error check).
#pragma once

#include <cuda_runtime.h>

#include "common.h"

// Caffe's grid-stride loop (device_alternate.hpp), with the index type explicit:
// Caffe's `int i` overflows past 2^31 elements, so the default here is int64_t.
// Each thread starts at its global index and strides by the whole grid, so any grid
// size covers any n, and the grid can be clamped to what the device keeps busy.
#define PRL_CUDA_KERNEL_LOOP_TYPE(i, n, index_type)                                        \
    for (index_type i = (index_type)blockIdx.x * blockDim.x + threadIdx.x,                 \
                    prl_stride_##i = (index_type)blockDim.x * gridDim.x;                   \
         i < (n); i += prl_stride_##i)
#define PRL_CUDA_KERNEL_LOOP(i, n) PRL_CUDA_KERNEL_LOOP_TYPE(i, n, int64_t)

namespace prl {

// Caffe2's CAFFE_CUDA_NUM_THREADS (Caffe had 512).  On H200, one 16-byte vector per
// thread: 128 threads a block streamed at 0.976-0.991 of cudaMemcpy's time, 256 at
// 0.979-0.994, 512 at 1.02, 1024 at 1.07 (benchmarks/grid_experiment.cu, three runs).
constexpr int kCudaNumThreads = 128;

// Caffe's CAFFE_GET_BLOCKS(n): one thread per work item, in as many blocks as that
// takes, clamped at kCudaMaxBlocks (2^27 threads) past which the grid-stride loop
// takes over.  Measured on H200 (benchmarks/NOTES.md): this grid streams at copy
// bandwidth, while a grid clamped to one resident wave (multiprocessor count x
// blocks per multiprocessor) stays ~7% below it at any unrolling.
constexpr int64_t kCudaMaxBlocks = int64_t(1) << 20;

inline unsigned int cuda_blocks(int64_t n) {
    const int64_t wanted = (n + kCudaNumThreads - 1) / kCudaNumThreads;
    return (unsigned int)(wanted < 1 ? 1 : (wanted < kCudaMaxBlocks ? wanted : kCudaMaxBlocks));
}

// Elements per 16-byte access for storage type T.
template <typename T> constexpr int kVec16 = 16 / (int)sizeof(T);

inline bool aligned16(const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline prl_status cuda_fail(const char *fn, const char *what, cudaError_t err) {
    (void)cudaGetLastError();  // clear the runtime's (non-sticky) last error
    return fail(PRL_ERROR_CUDA, "%s: %s failed: %s (%s)", fn, what, cudaGetErrorName(err), cudaGetErrorString(err));
}

// Makes `device` current for the scope (-1: keep the current one) and restores the
// caller's device afterwards, like c10::cuda::CUDAGuard.
class DeviceGuard {
  public:
    explicit DeviceGuard(int device) {
        error_ = cudaGetDevice(&previous_);
        if (error_ != cudaSuccess) return;
        device_ = device < 0 ? previous_ : device;
        if (device_ != previous_) {
            error_ = cudaSetDevice(device_);
            changed_ = error_ == cudaSuccess;
        }
    }
    ~DeviceGuard() {
        if (changed_) (void)cudaSetDevice(previous_);
    }
    DeviceGuard(const DeviceGuard &) = delete;
    DeviceGuard &operator=(const DeviceGuard &) = delete;
    cudaError_t error() const { return error_; }
    int device() const { return device_; }

  private:
    int previous_ = 0, device_ = 0;
    bool changed_ = false;
    cudaError_t error_ = cudaSuccess;
};

// Runs launch() with `device` current and turns any launch error into a status.
// Never synchronises: an error of the kernel itself appears at the caller's next sync.
template <typename Launch> prl_status cuda_launch(const char *fn, int device, Launch &&launch) {
    DeviceGuard guard(device);
    if (guard.error() != cudaSuccess) return cuda_fail(fn, "selecting the CUDA device", guard.error());
    launch();
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return cuda_fail(fn, "the kernel launch", err);
    return PRL_SUCCESS;
}

}  // namespace prl
