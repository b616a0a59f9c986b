// cuda_common.cuh - Caffe's kernel idiom with today's fixes, and the launch wrapper
// every CUDA entry point goes through (device guard, launch-error check).
#pragma once

#include <cuda_runtime.h>

#include <atomic>

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

// The same loop, with each iteration owning U elements spaced a grid apart:
// i, i + prl::grid_stride(), ..., i + (U-1) * prl::grid_stride().  The body loads
// all U before using any, so each thread keeps U independent loads in flight (a
// memory-bound kernel needs them to reach copy bandwidth), and every one of those
// loads is still coalesced across the warp.
#define PRL_CUDA_KERNEL_LOOP_UNROLLED(i, n, U)                                             \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);              \
         i += (int64_t)(U) * blockDim.x * gridDim.x)

namespace prl {

__device__ __forceinline__ int64_t grid_stride() { return (int64_t)blockDim.x * gridDim.x; }

constexpr int kCudaNumThreads = 256;  // Caffe's CAFFE_CUDA_NUM_THREADS, in a modern size

// Multiprocessor count of `device`, read once per device and cached.
inline int multiprocessor_count(int device) {
    constexpr int kMaxCached = 64;
    static std::atomic<int> cache[kMaxCached];
    if (device >= 0 && device < kMaxCached) {
        const int cached = cache[device].load(std::memory_order_relaxed);
        if (cached > 0) return cached;
    }
    int count = 0;
    if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || count <= 0) {
        (void)cudaGetLastError();
        return 132;  // a safe guess: the grid-stride loop is correct for any grid size
    }
    if (device >= 0 && device < kMaxCached) cache[device].store(count, std::memory_order_relaxed);
    return count;
}

// How many blocks of `Kernel` one multiprocessor runs at once (registers decide),
// asked of the occupancy calculator once per kernel and device, then cached.
template <auto Kernel> int resident_blocks_per_sm(int device) {
    constexpr int kMaxCached = 64;
    static std::atomic<int> cache[kMaxCached];
    if (device >= 0 && device < kMaxCached) {
        const int cached = cache[device].load(std::memory_order_relaxed);
        if (cached > 0) return cached;
    }
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, Kernel, kCudaNumThreads, 0) != cudaSuccess ||
        blocks <= 0) {
        (void)cudaGetLastError();
        return 4;
    }
    if (device >= 0 && device < kMaxCached) cache[device].store(blocks, std::memory_order_relaxed);
    return blocks;
}

// Caffe's CAFFE_GET_BLOCKS(n), clamped to one full wave of `Kernel` on the device:
// every block is resident from the start, so no multiprocessor idles through a
// partial last wave while the others finish (the grid-stride loop covers any n).
template <auto Kernel> unsigned int cuda_blocks(int64_t n, int device) {
    const int64_t wanted = (n + kCudaNumThreads - 1) / kCudaNumThreads;
    const int64_t wave = (int64_t)multiprocessor_count(device) * resident_blocks_per_sm<Kernel>(device);
    return (unsigned int)(wanted < 1 ? 1 : (wanted < wave ? wanted : wave));
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

// Runs launch(device) on `device` and turns any launch error into a status.
// Never synchronises: an error of the kernel itself appears at the caller's next sync.
template <typename Launch> prl_status cuda_launch(const char *fn, int device, Launch &&launch) {
    DeviceGuard guard(device);
    if (guard.error() != cudaSuccess) return cuda_fail(fn, "selecting the CUDA device", guard.error());
    launch(guard.device());
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return cuda_fail(fn, "the kernel launch", err);
    return PRL_SUCCESS;
}

}  // namespace prl
