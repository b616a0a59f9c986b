// lltm_cuda.cu - prl_lltm_forward_cuda, prl_lltm_backward_cuda, prl_lltm_backward_parts_cuda, and a pack's
// step loop over them and the caller's cuBLAS: prl_lltm_packed_steps_forward_cuda / _backward_cuda.
//
// The grid-stride loop runs over groups of V consecutive columns of the [batch, state]
// cell: up to V = 16 / sizeof(T) (one 16-byte access per operand) when state is a
// multiple of that and every buffer is 16-byte aligned, fewer where a launch would have
// few threads (dispatch_lltm), else V = 1.  The row/column split costs a division per
// group: 32-bit when every index fits (the usual case), else 64-bit.
#include <initializer_list>
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

// grad_h_parts: `parts` more terms of the gradient of new_h, laid out as lltm_backward_cols
// says (part_stride, part_row; prl_lltm_backward_parts_cuda's [parts, batch, state], a split
// step product's [batch, parts, state]; none for prl_lltm_backward_cuda).
template <typename T, int V, typename I>
__global__ void lltm_backward_kernel(const T *__restrict__ grad_h, const T *__restrict__ grad_cell,
                                     const T *__restrict__ gates, const T *__restrict__ old_cell,
                                     T *__restrict__ d_gates, T *__restrict__ d_old_cell, I groups, I state,
                                     const T *__restrict__ grad_h_parts, int parts, I part_stride, I part_row) {
    const I groups_per_row = state / V;
    PRL_CUDA_KERNEL_LOOP_TYPE(k, groups, I) {
        const I row = k / groups_per_row;
        prl::lltm_backward_cols<V, T, I>(row, (k - row * groups_per_row) * V, state, grad_h, grad_cell,
                                         grad_h != nullptr, grad_cell != nullptr, gates, old_cell, d_gates,
                                         d_old_cell, grad_h_parts, parts, part_stride, part_row);
    }
}

// The backward with the bias gradient fused in: d_bias = the column sums of d_gates.
// A block (kBiasCols x kBiasRows threads) owns a tile of kBiasCols state columns
// (3 * kBiasCols gate columns) for every row: row lane y walks rows y, y + kBiasRows,
// ..., summing what it stores; the lanes' partial sums then meet in shared memory and
// are added in lane order, so the result does not depend on scheduling.  Caffe's
// grid-stride loop, one level up: blocks stride over the tiles.  Only kBiasCols x
// kBiasRows threads work on each 32 columns, so this suits small batches (host-bound,
// where saving a reduction launch is what counts); large ones reduce separately.
constexpr int kBiasCols = 32, kBiasRows = 16;

template <typename T, typename I>
__global__ void __launch_bounds__(kBiasCols * kBiasRows)
    lltm_backward_bias_kernel(const T *__restrict__ grad_h, const T *__restrict__ grad_cell,
                              const T *__restrict__ gates, const T *__restrict__ old_cell, T *__restrict__ d_gates,
                              T *__restrict__ d_old_cell, T *__restrict__ d_bias, I batch, I state) {
    using A = prl::acc_t<T>;
    __shared__ A partial[3][kBiasRows][kBiasCols];
    const bool has_h = grad_h != nullptr, has_cell = grad_cell != nullptr;
    const I tiles = (state + kBiasCols - 1) / kBiasCols;
    for (I tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const I col = tile * kBiasCols + threadIdx.x;
        A sum[3] = {A(0), A(0), A(0)};
        if (col < state) {
            for (I row = threadIdx.y; row < batch; row += kBiasRows) {
                const I k = row * state + col, g = row * 3 * state + col;
                const A gh = has_h ? prl::load(grad_h[k]) : A(0), gc = has_cell ? prl::load(grad_cell[k]) : A(0);
                A d[3], d_cell;
                prl::lltm_backward_math<T>(gh, gc, prl::load(gates[g]), prl::load(gates[g + state]),
                                           prl::load(gates[g + 2 * state]), prl::load(old_cell[k]), d[0], d[1], d[2],
                                           d_cell);
#pragma unroll
                for (int j = 0; j < 3; ++j) {
                    const T stored = prl::store<T>(d[j]);
                    d_gates[g + j * state] = stored;
                    sum[j] += prl::load(stored);  // the sum of d_gates as stored, as a separate reduction would see it
                }
                d_old_cell[k] = prl::store<T>(d_cell);
            }
        }
#pragma unroll
        for (int j = 0; j < 3; ++j) partial[j][threadIdx.y][threadIdx.x] = sum[j];
        __syncthreads();
        if (threadIdx.y < 3 && col < state) {  // lanes 0, 1, 2 finish the input, output and candidate gates
            A total = A(0);
            for (int r = 0; r < kBiasRows; ++r) total += partial[threadIdx.y][r][threadIdx.x];
            d_bias[threadIdx.y * state + col] = prl::store<T>(total);
        }
        __syncthreads();  // partial is reused by the next tile
    }
}

// Picks the vector width V and the index type I, then calls launch(kernel_tag<V, I>{}, groups).
template <int V, typename I> struct kernel_tag {
    static constexpr int vec = V;
    using index = I;
};

// 32-bit indices are safe while the largest index (3 * batch * state) plus one grid
// stride (at most 2^27 threads) stays below 2^32.  (The bias kernel's loops step over
// rows and tiles, whose counters stay far smaller.)
// With `parts` terms of [batch, state] added to grad_h (prl_lltm_backward_parts_cuda), the
// largest index is parts * batch * state.
bool indices_fit_32bit(int64_t batch, int64_t state, int64_t parts = 0) {
    const int64_t limit = (int64_t(1) << 32) - (int64_t(1) << 29);
    return 3 * batch * state < limit && parts * batch * state < limit;
}

// The pointwise kernels' vector width.  16-byte accesses (V = 16 / sizeof(T)) move the most
// bytes per instruction, but each thread then computes V cells' activations one after the
// other, and a [batch, state] cell of a few hundred thousand elements gives the GPU only a few
// warps per multiprocessor: at (256, 1024) in bfloat16, V = 8 is 32768 threads, 12%
// occupancy, and the kernel waits on its own arithmetic (H100, in a CUDA graph: 3.6 us
// forward, 4.7 us backward, against 1.7 us for a copy of the gates; 2.7 / 3.2 us at 2^17
// threads).  So V halves until the launch has at least kPointwiseMinThreads threads (or
// V = 1); large cells keep 16-byte accesses, which there measured faster (2^16 to 2^18
// and always V = 1 measured: benchmarks/NOTES.md).
constexpr int64_t kPointwiseMinThreads = int64_t(1) << 17;

template <typename T, typename I, typename Launch>
void launch_with_width(int vec, int64_t n, Launch &&launch) {
    if constexpr (prl::kVec16<T> >= 8) {
        if (vec == 8) return launch(kernel_tag<8, I>{}, n / 8);
    }
    if constexpr (prl::kVec16<T> >= 4) {
        if (vec == 4) return launch(kernel_tag<4, I>{}, n / 4);
    }
    if (vec == 2) return launch(kernel_tag<2, I>{}, n / 2);
    launch(kernel_tag<1, I>{}, n);
}

template <typename T, typename Launch>
void dispatch_lltm(int64_t batch, int64_t state, bool all_aligned, Launch &&launch, int64_t parts = 0) {
    const int64_t n = batch * state;
    int vec = all_aligned && state % prl::kVec16<T> == 0 ? prl::kVec16<T> : 1;
    while (vec > 1 && n / vec < kPointwiseMinThreads) vec /= 2;
    if (indices_fit_32bit(batch, state, parts)) launch_with_width<T, uint32_t>(vec, n, launch);
    else launch_with_width<T, int64_t>(vec, n, launch);
}

bool all_aligned16(std::initializer_list<const void *> pointers) {
    for (const void *p : pointers)
        if (p != nullptr && !prl::aligned16(p)) return false;
    return true;
}

// The backward kernel over a [batch, state] cell (batch * state > 0), the gradient of new_h
// being grad_h plus `parts` terms of grad_h_parts (none: parts = 0), [parts, batch, state], or
// [batch, parts, state] where side_by_side.
template <typename T>
void launch_backward(const void *grad_h, const void *grad_h_parts, int64_t parts, const void *grad_cell,
                     const void *gates, const void *old_cell, void *d_gates, void *d_old_cell, int64_t batch,
                     int64_t state, cudaStream_t stream, bool side_by_side = false) {
    const bool aligned = all_aligned16({grad_h, grad_h_parts, grad_cell, gates, old_cell, d_gates, d_old_cell});
    dispatch_lltm<T>(
        batch, state, aligned,
        [&](auto tag, int64_t groups) {
            using I = typename decltype(tag)::index;
            lltm_backward_kernel<T, decltype(tag)::vec, I><<<prl::cuda_blocks(groups), prl::kCudaNumThreads, 0, stream>>>(
                static_cast<const T *>(grad_h), static_cast<const T *>(grad_cell), static_cast<const T *>(gates),
                static_cast<const T *>(old_cell), static_cast<T *>(d_gates), static_cast<T *>(d_old_cell), (I)groups,
                (I)state, static_cast<const T *>(grad_h_parts), (int)parts,
                (I)(side_by_side ? state : batch * state), (I)(side_by_side ? parts * state : state));
        },
        parts);
}

template <typename T>
void launch_forward(const void *gates, const void *old_cell, void *new_h, void *new_cell, int64_t batch, int64_t state,
                    cudaStream_t stream) {
    const bool aligned = all_aligned16({gates, old_cell, new_h, new_cell});
    dispatch_lltm<T>(batch, state, aligned, [&](auto tag, int64_t groups) {
        using I = typename decltype(tag)::index;
        lltm_forward_kernel<T, decltype(tag)::vec, I>
            <<<prl::cuda_blocks(groups), prl::kCudaNumThreads, 0, stream>>>(
            static_cast<const T *>(gates), static_cast<const T *>(old_cell), static_cast<T *>(new_h),
            static_cast<T *>(new_cell), (I)groups, (I)state);
    });
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
            launch_forward<T>(gates, old_cell, new_h, new_cell, batch, state, static_cast<cudaStream_t>(stream));
        });
    });
    PRL_API_END
}

extern "C" PRL_API prl_status prl_lltm_backward_cuda(const void *grad_h, const void *grad_cell, const void *gates,
                                                     const void *old_cell, void *d_gates, void *d_old_cell,
                                                     void *d_bias, int64_t batch, int64_t state, int dtype,
                                                     int device, void *stream) {
    PRL_API_BEGIN
    const char *fn = __func__;
    PRL_TRY(prl::check_lltm_backward_args(fn, gates, old_cell, d_gates, d_old_cell, d_bias, batch, state));
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (state == 0 || (batch == 0 && d_bias == nullptr)) return PRL_SUCCESS;
        auto s = static_cast<cudaStream_t>(stream);
        if (batch == 0)  // an empty batch: the bias gradient is zero (all-zero bits, in every dtype)
            return prl::cuda_launch(fn, device, [&] {  // a failure is the runtime's last error: cuda_launch reports it
                (void)cudaMemsetAsync(d_bias, 0, 3 * state * sizeof(T), s);
            });
        return prl::cuda_launch(fn, device, [&] {
            if (d_bias != nullptr) {
                const int64_t tiles = (state + kBiasCols - 1) / kBiasCols;
                auto launch = [&](auto index) {
                    using I = decltype(index);
                    lltm_backward_bias_kernel<T, I>
                        <<<(unsigned int)(tiles < prl::kCudaMaxBlocks ? tiles : prl::kCudaMaxBlocks),
                           dim3(kBiasCols, kBiasRows), 0, s>>>(
                            static_cast<const T *>(grad_h), static_cast<const T *>(grad_cell),
                            static_cast<const T *>(gates), static_cast<const T *>(old_cell), static_cast<T *>(d_gates),
                            static_cast<T *>(d_old_cell), static_cast<T *>(d_bias), (I)batch, (I)state);
                };
                if (indices_fit_32bit(batch, state)) launch(uint32_t{});
                else launch(int64_t{});
                return;
            }
            launch_backward<T>(grad_h, nullptr, 0, grad_cell, gates, old_cell, d_gates, d_old_cell, batch, state, s);
        });
    });
    PRL_API_END
}

extern "C" PRL_API prl_status prl_lltm_backward_parts_cuda(const void *grad_h, const void *grad_h_parts,
                                                           int64_t parts, const void *grad_cell, const void *gates,
                                                           const void *old_cell, void *d_gates, void *d_old_cell,
                                                           int64_t batch, int64_t state, int dtype, int device,
                                                           void *stream) {
    PRL_API_BEGIN
    const char *fn = __func__;
    PRL_TRY(prl::check_lltm_backward_parts_args(fn, grad_h_parts, parts, gates, old_cell, d_gates, d_old_cell, batch,
                                                state));
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (batch * state == 0) return PRL_SUCCESS;
        return prl::cuda_launch(fn, device, [&] {
            launch_backward<T>(grad_h, grad_h_parts, parts, grad_cell, gates, old_cell, d_gates, d_old_cell, batch,
                               state, static_cast<cudaStream_t>(stream));
        });
    });
    PRL_API_END
}

// ---- a pack's step loop, each step's product by the caller's cuBLAS -------------------------
//
// Where the persistent kernels do not fit, a pack runs step by step: a product over the step's
// rows, then the pointwise kernel.  From Python each step costs a torch GEMM's and a ctypes
// call's host time, more than the step's GPU work at moderate sizes.  Here the library runs
// the loop: the product is cublasGemmStridedBatchedEx of a cuBLAS already in the process (its
// address and handle come from the caller: no link to cuBLAS), the pointwise kernels are the
// ones above, and a step's host time is two launches' (most of it cuBLAS's own host path, 9-20
// us a call on an H100: benchmarks/NOTES.md).  The D directions of a
// bidirectional layer run as one batched product (rows of the step-major buffers interleave
// the directions: [rows, D, width]).
namespace {

// cublasGemmStridedBatchedEx's enum values, the same in cuBLAS 11 to 13.
constexpr int kCublasOpN = 0, kCublasOpT = 1, kCublasGemmDefault = -1;
constexpr int kCudaR32F = 0, kCudaR64F = 1, kCudaR16F = 2, kCudaR16BF = 14;
constexpr int kCublasCompute32F = 68, kCublasCompute32FFastTF32 = 77, kCublasCompute64F = 70;

template <typename T> constexpr int cuda_data_type() {
    return std::is_same<T, float>::value ? kCudaR32F : std::is_same<T, double>::value ? kCudaR64F
           : std::is_same<T, prl::half_t>::value ? kCudaR16F : kCudaR16BF;
}

// c[d] (rows x m, row stride ldc) = beta c[d] + a[d] (rows x k, row stride lda) @ op(w[d]) for the
// directions d < D, each operand `stride` elements after the one before: op(w) = w^T for w
// [m, k] (transposed), else w [k, m]; every matrix row-major.  Column-major for cuBLAS:
// c^T = op(w)^T a^T.
template <typename T>
int product(prl_cublas_gemm_fn gemm, void *handle, int tf32, bool transposed, int64_t rows, int64_t m, int64_t k,
            const T *a, int64_t lda, int64_t a_stride, const T *w, int64_t ldw, int64_t w_stride, bool accumulate,
            T *c, int64_t ldc, int64_t c_stride, int64_t directions) {
    using A = prl::acc_t<T>;
    const A one = A(1), beta = accumulate ? A(1) : A(0);
    const int type = cuda_data_type<T>();
    const int compute = std::is_same<T, double>::value ? kCublasCompute64F
                        : std::is_same<T, float>::value && tf32 ? kCublasCompute32FFastTF32 : kCublasCompute32F;
    return gemm(handle, transposed ? kCublasOpT : kCublasOpN, kCublasOpN, (int)m, (int)rows, (int)k, &one, w, type,
                (int)ldw, (long long)w_stride, a, type, (int)lda, (long long)a_stride, &beta, c, type, (int)ldc,
                (long long)c_stride, (int)directions, compute, kCublasGemmDefault);
}

struct Buffer {
    const char *name;
    const void *p;
};

// The arguments both loops share, and their buffers (each must be there where the pack has rows);
// rows_in_all: sum(batch_sizes), the step-major buffers' rows.
prl_status check_steps_args(const char *fn, prl_cublas_gemm_fn gemm, void *handle, const int64_t *batch_sizes,
                            int64_t steps, int64_t batch, int64_t state, int64_t directions, int64_t ldw,
                            int64_t w_stride, std::initializer_list<Buffer> buffers, int64_t &rows_in_all) {
    if (gemm == nullptr || handle == nullptr)
        return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: argument '%s' is NULL", fn, gemm ? "handle" : "gemm");
    if (directions != 1 && directions != 2)
        return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: argument 'directions' must be 1 or 2, got %lld", fn,
                         (long long)directions);
    PRL_TRY(prl::check_sequence_sizes(fn, steps, batch * directions, state, ldw));
    if (directions == 2 && w_stride < 3 * state * ldw)
        return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: argument 'w_stride' (%lld) must be >= 3 * state * ldw",
                         fn, (long long)w_stride);
    if (steps > 0 && batch_sizes == nullptr)
        return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: argument 'batch_sizes' is NULL", fn);
    for (int64_t t = 0; t < steps; ++t)  // host memory: checked, as the CPU loops check theirs
        if (batch_sizes[t] < 1 || batch_sizes[t] > (t ? batch_sizes[t - 1] : batch))
            return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: batch_sizes[%lld] = %lld: a pack's sizes are >= 1, "
                             "never grow, and start at most at batch (%lld)", fn, (long long)t,
                             (long long)batch_sizes[t], (long long)batch);
    rows_in_all = 0;
    for (int64_t t = 0; t < steps; ++t) rows_in_all += batch_sizes[t];
    for (const Buffer &buffer : buffers)
        PRL_TRY(prl::check_pointer(fn, buffer.name, buffer.p, rows_in_all * directions * state));
    return PRL_SUCCESS;
}

prl_status cublas_fail(const char *fn, int64_t t, int status) {
    return prl::fail(PRL_ERROR_CUDA, "%s: cuBLAS's product of step %lld failed (cublasStatus_t %d)", fn, (long long)t,
                     status);
}

}  // namespace

extern "C" PRL_API prl_status prl_lltm_packed_steps_forward_cuda(prl_cublas_gemm_fn gemm, void *handle, int tf32,
                                                                 void *gates, const void *w_h, int64_t ldw,
                                                                 int64_t w_stride, const void *h0, const void *c0,
                                                                 void *output, void *cells,
                                                                 const int64_t *batch_sizes, int64_t steps,
                                                                 int64_t batch, int64_t state, int64_t directions,
                                                                 int dtype, int device, void *stream) {
    PRL_API_BEGIN
    const char *fn = __func__;
    int64_t rows_in_all = 0;
    PRL_TRY(check_steps_args(fn, gemm, handle, batch_sizes, steps, batch, state, directions, ldw, w_stride,
                             {{"gates", gates}, {"w_h", w_h}, {"h0", h0}, {"c0", c0}, {"output", output},
                              {"cells", cells}},
                             rows_in_all));
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        const int64_t D = directions, width = D * state;  // a row of h and cells: [D, S]; of gates: [D, 3S]
        auto s = static_cast<cudaStream_t>(stream);
        prl::DeviceGuard guard(device);
        if (guard.error() != cudaSuccess) return prl::cuda_fail(fn, "selecting the CUDA device", guard.error());
        const T *h = static_cast<const T *>(h0), *c = static_cast<const T *>(c0);
        int64_t row = 0;
        for (int64_t t = 0; t < steps; ++t) {
            const int64_t rows = batch_sizes[t];
            T *g = static_cast<T *>(gates) + row * 3 * width;
            // gates_t[:, d] += h_{t-1}[:rows, d] @ W_h[d]^T
            const int status = product<T>(gemm, handle, tf32, true, rows, 3 * state, state, h, width, state,
                                          static_cast<const T *>(w_h), ldw, w_stride, true, g, 3 * width, 3 * state, D);
            if (status != 0) return cublas_fail(fn, t, status);
            T *new_h = static_cast<T *>(output) + row * width, *new_c = static_cast<T *>(cells) + row * width;
            launch_forward<T>(g, c, new_h, new_c, rows * D, state, s);  // [rows * D] cells: rows of both directions
            const cudaError_t err = cudaGetLastError();
            if (err != cudaSuccess) return prl::cuda_fail(fn, "the kernel launch", err);
            h = new_h;
            c = new_c;
            row += rows;
        }
        return PRL_SUCCESS;
    });
    PRL_API_END
}

extern "C" PRL_API prl_status prl_lltm_packed_steps_backward_cuda(prl_cublas_gemm_fn gemm, void *handle, int tf32,
                                                                  const void *grad_output, const void *gates,
                                                                  const void *w_h, int64_t ldw, int64_t w_stride,
                                                                  const void *c0, const void *cells, void *d_cell,
                                                                  void *d_h, void *d_gates, void *d_h0, void *d_c0,
                                                                  const int64_t *batch_sizes, int64_t steps,
                                                                  int64_t batch, int64_t state, int64_t directions,
                                                                  int64_t parts, int dtype, int device, void *stream) {
    PRL_API_BEGIN
    const char *fn = __func__;
    int64_t rows_in_all = 0;
    PRL_TRY(check_steps_args(fn, gemm, handle, batch_sizes, steps, batch, state, directions, ldw, w_stride,
                             {{"grad_output", grad_output}, {"gates", gates}, {"w_h", w_h}, {"c0", c0},
                              {"cells", cells}, {"d_cell", d_cell}, {"d_h", d_h}, {"d_gates", d_gates},
                              {"d_h0", d_h0}, {"d_c0", d_c0}},
                             rows_in_all));
    if (parts < 1 || parts > prl::kMaxLltmParts || (3 * state) % parts != 0)
        return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: argument 'parts' (%lld) must be 1 to %d and divide "
                         "3 * state (%lld)", fn, (long long)parts, prl::kMaxLltmParts, (long long)(3 * state));
    if (parts > 1 && directions == 2 && w_stride != 3 * state * ldw)
        return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: with parts > 1, argument 'w_stride' (%lld) must be "
                         "3 * state * ldw (%lld): the directions' W_h back to back", fn, (long long)w_stride,
                         (long long)(3 * state * ldw));
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        const int64_t D = directions, width = D * state;
        auto s = static_cast<cudaStream_t>(stream);
        prl::DeviceGuard guard(device);
        if (guard.error() != cudaSuccess) return prl::cuda_fail(fn, "selecting the CUDA device", guard.error());
        // d_cell: two [batch, D, S] buffers in turn (a kernel's input and output must not
        // overlap), each holding grad_c_n on entry: a row's entry is the gradient of its cell
        // from the step after, or grad_c_n at its own last step, where no later step wrote it.
        // d_h: the gradient reaching h_t from step t + 1's product, zero on entry; the rows
        // ending at step t were never written by a later (smaller) step, so they stay zero.
        T *cell_grads[2] = {static_cast<T *>(d_cell), static_cast<T *>(d_cell) + batch * width};
        int64_t end = rows_in_all;  // the first row past step t
        for (int64_t t = steps - 1; t >= 0; --t) {
            const int64_t rows = batch_sizes[t], later = t + 1 < steps ? batch_sizes[t + 1] : 0, row = end - rows;
            const T *old = t == 0 ? static_cast<const T *>(c0)
                                  : static_cast<const T *>(cells) + (row - batch_sizes[t - 1]) * width;
            T *dg = static_cast<T *>(d_gates) + row * 3 * width;
            launch_backward<T>(static_cast<const T *>(grad_output) + row * width, later ? d_h : nullptr,
                               later ? parts : 0, cell_grads[(t + 1) % 2],
                               static_cast<const T *>(gates) + row * 3 * width, old, dg,
                               t == 0 ? d_c0 : cell_grads[t % 2], rows * D, state, s, true);
            const cudaError_t err = cudaGetLastError();
            if (err != cudaSuccess) return prl::cuda_fail(fn, "the kernel launch", err);
            // the gradient reaching h_{t-1}[:rows, d] = d_gates_t[:, d] @ W_h[d] (d_h0 at t = 0), or
            // its parts: product i = d * parts + p of the batch takes the p-th slice of the 3S inner
            // dimension (the slices of both directions' W_h evenly spaced, as they lie back to
            // back) and writes d_h[:rows, d, p]
            const int64_t split = t == 0 ? 1 : parts, k = 3 * state / split;
            const int status = product<T>(gemm, handle, tf32, false, rows, state, k, dg, 3 * width, k,
                                          static_cast<const T *>(w_h), ldw, split > 1 ? k * ldw : w_stride, false,
                                          static_cast<T *>(t == 0 ? d_h0 : d_h), split * width, state, D * split);
            if (status != 0) return cublas_fail(fn, t, status);
            end = row;
        }
        return PRL_SUCCESS;
    });
    PRL_API_END
}
