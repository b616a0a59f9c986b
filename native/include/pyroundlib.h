/*
 * pyroundlib.h - the whole C ABI of libpyroundlib, in one header.
 *
 * A plain C99 interface (usable from C++ too) to pointwise kernels for PyTorch-style
 * tensors: a round-half-to-even ("round") and the pointwise steps of the LLTM
 * recurrent cell.  Every function takes raw pointers to contiguous, row-major
 * buffers, 64-bit element counts, a dtype code and, for CUDA, a device index and a
 * stream handle.  The library has no link to libtorch or libpython.
 *
 * Conventions
 *   - Every computing function returns a prl_status; PRL_SUCCESS (0) is success.
 *     prl_status_string() names a status, prl_last_error() gives the detail of the
 *     calling thread's most recent failure (which argument, which CUDA error).
 *   - No C++ exception crosses this boundary and the library never aborts the process.
 *   - CUDA functions only enqueue work: they never synchronise the device or the
 *     stream, so every call can be captured in a CUDA graph.  `device` is the CUDA
 *     device index the pointers live on (-1: the calling thread's current device);
 *     the function makes it current for the launch and restores the caller's device.
 *     `stream` is a cudaStream_t of that device (NULL: the legacy default stream).
 *   - A CUDA launch error is returned as PRL_ERROR_CUDA; an error of a kernel that
 *     has already been enqueued surfaces, as in any CUDA program, at the next
 *     synchronising call of the caller.
 *   - Input and output buffers must not overlap, except that the round functions
 *     accept x == y (in place).
 *
 *   - `dtype` is a prl_dtype code and status codes are prl_status values; both travel
 *     as plain int so that any code a caller passes is well-defined to receive (an
 *     unknown one returns PRL_ERROR_UNSUPPORTED_DTYPE / the name "PRL_UNKNOWN_STATUS").
 *
 * ABI versioning: PRL_ABI_VERSION is bumped whenever any signature or enum value
 * changes; loaders compare prl_abi_version() with the version they were written for.
 */
#ifndef PYROUNDLIB_H_
#define PYROUNDLIB_H_

#include <stdint.h>

#if defined(_WIN32)
#  if defined(PRL_BUILDING_LIBRARY)
#    define PRL_API __declspec(dllexport)
#  else
#    define PRL_API __declspec(dllimport)
#  endif
#else
#  define PRL_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define PRL_ABI_VERSION 15

typedef enum prl_status {
    PRL_SUCCESS = 0,
    PRL_ERROR_INVALID_ARGUMENT = 1,   /* null pointer with n > 0, negative size, ... */
    PRL_ERROR_UNSUPPORTED_DTYPE = 2,  /* dtype code not in prl_dtype */
    PRL_ERROR_CUDA = 3,               /* a CUDA runtime call or kernel launch failed */
    PRL_ERROR_CUDA_NOT_COMPILED = 4,  /* a CUDA function was called on a CPU-only build */
    PRL_ERROR_INTERNAL = 5            /* an unexpected C++ exception, caught at the boundary */
} prl_status;

typedef enum prl_dtype {
    PRL_FLOAT32 = 0,
    PRL_FLOAT64 = 1,
    PRL_FLOAT16 = 2,   /* IEEE binary16; computed in float */
    PRL_BFLOAT16 = 3   /* bfloat16; computed in float */
} prl_dtype;

/* ---- library information ------------------------------------------------------ */

/* PRL_ABI_VERSION of the library that is loaded. */
PRL_API int prl_abi_version(void);
/* 1 if the CUDA functions are compiled in, 0 for a CPU-only build. */
PRL_API int prl_has_cuda(void);
/* The CUDA architectures compiled in, e.g. "75-real;80-real;90-real;90-virtual", or "" for CPU-only. */
PRL_API const char *prl_cuda_architectures(void);
/* A static, human-readable name for a status, e.g. "PRL_ERROR_INVALID_ARGUMENT". */
PRL_API const char *prl_status_string(int status);
/* The calling thread's most recent error message ("" if none). Valid until the
 * thread's next failing call into the library. */
PRL_API const char *prl_last_error(void);

/* ---- round: y[i] = round-half-to-even(x[i]), i < n ----------------------------------
 * Bit-for-bit torch.round: ties go to the even neighbour, -0.0, +-inf and NaN pass
 * through, |x| beyond the type's integer range is returned unchanged. */
PRL_API prl_status prl_round_cpu(const void *x, void *y, int64_t n, int dtype);
PRL_API prl_status prl_round_cuda(const void *x, void *y, int64_t n, int dtype,
                                  int device, void *stream);

/* ---- LLTM pointwise forward -----------------------------------------------------------
 * gates:    [batch, 3*state] = X @ W^T + b, chunks (input, output, candidate)
 * old_cell: [batch, state]
 * new_h, new_cell: [batch, state] (outputs)
 *   i = sigmoid(g0), o = sigmoid(g1), c = elu(g2), new_cell = old_cell + c * i,
 *   new_h = tanh(new_cell) * o */
PRL_API prl_status prl_lltm_forward_cpu(const void *gates, const void *old_cell,
                                        void *new_h, void *new_cell,
                                        int64_t batch, int64_t state, int dtype);
PRL_API prl_status prl_lltm_forward_cuda(const void *gates, const void *old_cell,
                                         void *new_h, void *new_cell,
                                         int64_t batch, int64_t state, int dtype,
                                         int device, void *stream);

/* ---- LLTM pointwise backward ----------------------------------------------------------
 * grad_h, grad_cell: [batch, state], gradients of new_h and new_cell; either may be
 *   NULL, meaning zero.
 * gates, old_cell: the forward's inputs (the activations are recomputed from them).
 * d_gates: [batch, 3*state], d_old_cell: [batch, state] (outputs).
 * d_bias: [3*state] (output), or NULL: when given, also the column sums of d_gates
 *   as stored (the gradient of b in gates = X @ W^T + b), accumulated in float
 *   (double for float64) in a fixed order, so the result is deterministic.  This
 *   fuses a reduction into the same pass (one launch, no second read of d_gates).
 *   On CUDA it selects a kernel that gives each tile of 32 columns one block: the
 *   right trade for small batches, where the launch is the cost; for large ones,
 *   pass NULL and reduce d_gates separately (a wide grid moves the bytes faster). */
PRL_API prl_status prl_lltm_backward_cpu(const void *grad_h, const void *grad_cell,
                                         const void *gates, const void *old_cell,
                                         void *d_gates, void *d_old_cell, void *d_bias,
                                         int64_t batch, int64_t state, int dtype);
PRL_API prl_status prl_lltm_backward_cuda(const void *grad_h, const void *grad_cell,
                                          const void *gates, const void *old_cell,
                                          void *d_gates, void *d_old_cell, void *d_bias,
                                          int64_t batch, int64_t state, int dtype,
                                          int device, void *stream);

/* ---- LLTM pointwise backward, the gradient of new_h given as a sum ------------------------
 * As prl_lltm_backward_* without d_bias, where the gradient of new_h is grad_h (NULL: zero)
 * plus `parts` (0 to 64) more terms: grad_h_parts [parts, batch, state], contiguous (NULL
 * when parts = 0).  The terms are added in the arithmetic type (float; double for
 * float64), in the order grad_h, grad_h_parts[0], grad_h_parts[1], ...  For a step of a
 * recurrence whose incoming gradient includes a product split along its inner dimension
 * (partial products, e.g. one strided-batched GEMM of d_gates [batch, 3*state] x
 * W_h [3*state, state] in `parts` slices of the 3*state): the kernel sums them as it reads
 * them, so no reduction or accumulation pass runs between the product and this kernel. */
PRL_API prl_status prl_lltm_backward_parts_cpu(const void *grad_h, const void *grad_h_parts, int64_t parts,
                                               const void *grad_cell, const void *gates, const void *old_cell,
                                               void *d_gates, void *d_old_cell,
                                               int64_t batch, int64_t state, int dtype);
PRL_API prl_status prl_lltm_backward_parts_cuda(const void *grad_h, const void *grad_h_parts, int64_t parts,
                                                const void *grad_cell, const void *gates, const void *old_cell,
                                                void *d_gates, void *d_old_cell,
                                                int64_t batch, int64_t state, int dtype,
                                                int device, void *stream);

/* ---- LLTM over a sequence: the recurrence in one call per direction (CUDA: one persistent kernel) ----
 * For a sequence of T steps the cell's gates are x_t @ W_x^T + b (the input half, which the
 * caller computes for all steps at once) plus h_{t-1} @ W_h^T (the recurrent half), where
 * weights [3*state, state + input] = [W_h | W_x] as for the cell.  These functions run the
 * recurrent half and the pointwise steps of all T steps: on CUDA in one cooperative launch,
 * the slice of W_h each block needs held on chip for the whole sequence (float16/bfloat16
 * products on tensor cores on sm_80+ where the plan finds that faster; the environment
 * variable PYROUNDLIB_TENSOR_CORES=1 / 0, read at each call (a plan is kept per setting),
 * takes them wherever they fit / never); on the CPU in one
 * loop (for short sequences and small states: no per-step call overhead) whose batch rows
 * are split among up to prl_cpu_threads() threads.
 *
 * prl_lltm_sequence_cuda_fits: *fits = 1 when (batch, state) in `dtype` fits, both
 *   directions, in one co-resident grid of `device` or (sm_90 and later) in thread-block
 *   clusters all resident at once; 2 when it fits only in row tiles whose threads finish two
 *   (row, column) pairs a step (16-bit batches too wide for one pair a thread, tensor cores):
 *   there a step costs more than a step loop replayed from CUDA graphs (H100), less than one
 *   launched step by step; else 0, then run the steps one by one (prl_lltm_forward_cuda /
 *   prl_lltm_backward_cuda and GEMMs of your own).
 *
 * w_h: the first `state` columns of weights, rows 3*state, row stride `ldw` elements
 *   (ldw = state + input for a contiguous weights).
 * Forward: gates [T, batch, 3*state]: on entry x_t @ W_x^T + b, on return the full
 *   pre-activations (what the backward reads); h0, c0 [batch, state]; output (new_h of
 *   every step) and cells (new_cell of every step) [T, batch, state] (outputs); c_n
 *   [batch, state]: the last step's new_cell once more (an output; NULL: not written).
 * Backward: grad_output [T, batch, state] (gradient of output), grad_c_n [batch, state]
 *   (gradient of the last new_cell; NULL = zero), gates / c0 / cells as the forward left
 *   them; d_gates [T, batch, 3*state], d_h0, d_c0 [batch, state] (outputs).  The weight,
 *   bias and input gradients are products of d_gates the caller forms.
 * prl_lltm_sequence_persistent_forward_cuda: the whole forward in one call, its input half
 *   included: first gates = input @ W_x^T + bias for every step (a tiled product on CUDA
 *   cores, float32 without TF32, each sum in a fixed order), then the recurrence as
 *   prl_lltm_sequence_forward_cuda.  Arguments as prl_lltm_sequence_fused_forward_cuda's:
 *   input [T, batch, features], weights [3*state, state + features] (contiguous), bias
 *   [3*state]; gates is an output.  With T = 0, c_n = c0.  A caller's GEMM launched first
 *   would cost its host time before the GPU starts. */
/* prl_set_cpu_threads: the most threads the CPU sequence functions use, the calling
 *   thread included (>= 1; 1, the default, keeps them on the calling thread).
 *   pyroundlib's Python package sets it to torch.get_num_threads() before each call.
 * prl_cpu_threads: the current setting.
 * prl_set_cpu_parallel: who runs those threads.  NULL (the default): the library's own
 *   workers, started when a call first needs them, asleep between calls.  Otherwise a
 *   fork-join runner: runner(fn, data, num_threads, 0) runs fn(data) on up to num_threads
 *   threads, the calling thread among them, and returns when every one has returned
 *   (any number of threads, even one, gives the same results).  num_threads is always
 *   prl_cpu_threads(), however few parts a call has: an OpenMP runtime keeps its threads
 *   only while teams keep their size.  That is the contract and
 *   signature of GOMP_parallel, the entry point of GCC's OpenMP ABI that libgomp, LLVM's
 *   libomp and Intel's libiomp5 all export: pyroundlib's Python package passes the one of
 *   the OpenMP runtime torch runs its intra-op threads on, so the library's work goes to
 *   the threads torch's last op left spinning instead of competing with them for cores.
 *   Used only by the process that set it: a child after fork() uses the library's own
 *   workers (an OpenMP runtime cannot be used in a child forked after it started a team). */
typedef void (*prl_parallel_fn)(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags);
PRL_API prl_status prl_set_cpu_threads(int64_t threads);
PRL_API int64_t prl_cpu_threads(void);
PRL_API prl_status prl_set_cpu_parallel(prl_parallel_fn runner);
/* prl_set_cpu_thread_num: the runner's thread numbers: fn() returns the calling thread's
 *   number in the runner's current team (0 for the thread that called the runner), as
 *   omp_get_thread_num does; NULL (the default): not known.  Where given, thread m of a
 *   region first takes part m of the work, the range torch's own parallel_for gives its
 *   thread m, so data a torch op has just touched is read from the same core's cache.  It
 *   changes which thread runs a part, never a result.  pyroundlib's Python package passes
 *   omp_get_thread_num of the runtime whose GOMP_parallel it passes. */
typedef int (*prl_thread_num_fn)(void);
PRL_API prl_status prl_set_cpu_thread_num(prl_thread_num_fn fn);
/* prl_set_cpu_gemm: the BLAS the CPU sequence functions multiply with: the Fortran-interface
 *   sgemm_ and dgemm_ of a BLAS already in the process (either may be NULL; both NULL, the
 *   default: the library's own product).  pyroundlib's Python package passes those torch's
 *   library exports (its MKL): each step's product is then torch's own GEMM, threaded by the
 *   BLAS, and the pointwise cells are split among prl_cpu_threads() threads.  Integers are
 *   passed as 64-bit values, which an LP64 BLAS reads right on a little-endian host (where
 *   they are below 2^31, as the sequence functions' sizes are); a big-endian host gets
 *   PRL_ERROR_INVALID_ARGUMENT.  Used only by the process that set it (a forked child uses
 *   the library's own product). */
typedef void (*prl_sgemm_fn)(const char *transa, const char *transb, const int64_t *m, const int64_t *n,
                             const int64_t *k, const float *alpha, const float *a, const int64_t *lda,
                             const float *b, const int64_t *ldb, const float *beta, float *c, const int64_t *ldc);
typedef void (*prl_dgemm_fn)(const char *transa, const char *transb, const int64_t *m, const int64_t *n,
                             const int64_t *k, const double *alpha, const double *a, const int64_t *lda,
                             const double *b, const int64_t *ldb, const double *beta, double *c,
                             const int64_t *ldc);
PRL_API prl_status prl_set_cpu_gemm(prl_sgemm_fn sgemm, prl_dgemm_fn dgemm);
PRL_API prl_status prl_lltm_sequence_cuda_fits(int64_t batch, int64_t state, int dtype, int device, int *fits);
PRL_API prl_status prl_lltm_sequence_forward_cpu(void *gates, const void *w_h, int64_t ldw,
                                                 const void *h0, const void *c0,
                                                 void *output, void *cells, void *c_n,
                                                 int64_t steps, int64_t batch, int64_t state, int dtype);
PRL_API prl_status prl_lltm_sequence_backward_cpu(const void *grad_output, const void *grad_c_n,
                                                  const void *gates, const void *w_h, int64_t ldw,
                                                  const void *c0, const void *cells,
                                                  void *d_gates, void *d_h0, void *d_c0,
                                                  int64_t steps, int64_t batch, int64_t state, int dtype);
/* prl_lltm_input_half_cpu: gates[r] = input[r] @ W_x^T + bias for rows r < `rows`, what the
 *   sequence functions above take as the input half: input [rows, features]; weights
 *   [3*state, state + features] (contiguous), W_x its last `features` columns; bias [3*state]
 *   or NULL (none); gates [rows, 3*state].  Sums in float32 (float64 for float64), stored in
 *   the dtype.  The library's own product, its blocks of rows split among the threads
 *   (prl_set_cpu_threads) where each part has 2^18 multiply-adds or more; the same bits at
 *   any thread count.  The Python package takes it below 2^19 multiply-adds, and on CPUs
 *   other than Intel's with AVX-512 from 32 features up. */
PRL_API prl_status prl_lltm_input_half_cpu(const void *input, const void *weights, const void *bias, void *gates,
                                           int64_t rows, int64_t features, int64_t state, int dtype);
/* prl_matmul_cpu: c = op(a) @ b by the same product: op(a) [m, k] is a [m, k] (transpose_a 0)
 *   or the transpose of a [k, m] (transpose_a 1), a's rows lda elements apart; b [k, n], rows
 *   ldb apart; c [m, n], rows ldc apart.  Sums in float32 (float64 for float64), each element
 *   one sum over k in order, stored in the dtype; blocks of c's rows split among the threads
 *   where each part has 2^18 multiply-adds or more (the same bits at any thread count).  The
 *   Python package takes it for a CPU sequence's gradient products on the same CPUs. */
PRL_API prl_status prl_matmul_cpu(const void *a, int64_t lda, int transpose_a, const void *b, int64_t ldb, void *c,
                                  int64_t ldc, int64_t m, int64_t n, int64_t k, int dtype);
/* prl_lltm_sequence_packed_forward_cpu / _backward_cpu: the same over a packed batch of
 *   sequences of different lengths (a PackedSequence's data), each run exactly its own steps.
 *   batch_sizes [T] (host memory): step t has the first batch_sizes[t] rows of the batch
 *   (sequences sorted longest first: batch_sizes[0] = batch, never growing, each >= 1; NULL:
 *   all `batch` rows every step, the functions above); the step-major buffers (gates,
 *   output, cells, grad_output, d_gates) hold step t's rows after those of steps 0..t-1,
 *   sum(batch_sizes) rows in all.  A row's new_cell at its own last step is its c_n (written
 *   there); backward, grad_c_n of a row enters at its own last step, which gets no gradient
 *   from a later one.  h0, c0, d_h0, d_c0 [batch, state] as above. */
PRL_API prl_status prl_lltm_sequence_packed_forward_cpu(void *gates, const void *w_h, int64_t ldw,
                                                        const void *h0, const void *c0,
                                                        void *output, void *cells, void *c_n,
                                                        const int64_t *batch_sizes, int64_t steps,
                                                        int64_t batch, int64_t state, int dtype);
PRL_API prl_status prl_lltm_sequence_packed_backward_cpu(const void *grad_output, const void *grad_c_n,
                                                         const void *gates, const void *w_h, int64_t ldw,
                                                         const void *c0, const void *cells,
                                                         void *d_gates, void *d_h0, void *d_c0,
                                                         const int64_t *batch_sizes, int64_t steps,
                                                         int64_t batch, int64_t state, int dtype);
/* prl_lltm_sequence_packed_forward_cuda / _backward_cuda: the packed functions above on CUDA,
 *   in the persistent kernels (where prl_lltm_sequence_cuda_fits says (batch, state) fit); a
 *   block whose rows have all ended idles through the steps left.  batch_sizes [T] is in
 *   device memory (prl_upload_cuda puts it there), read by the kernels and not checked: the
 *   caller passes a sorted pack's sizes, as the CPU functions check them.
 * prl_upload_cuda: copies `count` int64 values from host memory `src` to device memory `dst`
 *   in `stream`'s order, carried in kernel parameters: the call returns at once (src may be
 *   reused), nothing waits on the device, and a CUDA graph that captures the call replays
 *   the values as they were (a copy from pageable host memory would make the host wait for
 *   the stream, and is not allowed while a stream is being captured). */
PRL_API prl_status prl_lltm_sequence_packed_forward_cuda(void *gates, const void *w_h, int64_t ldw,
                                                         const void *h0, const void *c0,
                                                         void *output, void *cells, void *c_n,
                                                         const int64_t *batch_sizes, int64_t steps,
                                                         int64_t batch, int64_t state, int dtype,
                                                         int device, void *stream);
PRL_API prl_status prl_lltm_sequence_packed_backward_cuda(const void *grad_output, const void *grad_c_n,
                                                          const void *gates, const void *w_h, int64_t ldw,
                                                          const void *c0, const void *cells,
                                                          void *d_gates, void *d_h0, void *d_c0,
                                                          const int64_t *batch_sizes, int64_t steps,
                                                          int64_t batch, int64_t state, int dtype,
                                                          int device, void *stream);
PRL_API prl_status prl_upload_cuda(void *dst, const int64_t *src, int64_t count, int device, void *stream);
/* prl_lltm_packed_steps_forward_cuda / _backward_cuda: a pack's recurrence step by step, for
 *   sizes the persistent kernels do not hold: each step's product by a cuBLAS the caller
 *   already has in the process, then the pointwise kernels (prl_lltm_forward_cuda /
 *   prl_lltm_backward_parts_cuda's), two launches a step from this loop.  The library does
 *   not link cuBLAS: `gemm` is the address of cublasGemmStridedBatchedEx (cuBLAS 11 or
 *   newer), `handle` a cublasHandle_t of `device` whose stream is `stream` (pyroundlib passes
 *   torch's: torch.cuda.current_blas_handle()); tf32 != 0 lets float32 products use TF32
 *   (CUBLAS_COMPUTE_32F_FAST_TF32).  A cuBLAS failure is returned as PRL_ERROR_CUDA.
 * `directions` (1 or 2) directions run at once, as one batched product a step: the
 *   step-major buffers hold each row's directions side by side (gates [N, D, 3*state],
 *   output and cells [N, D, state], N = sum(batch_sizes)), h0, c0 [batch, D, state];
 *   direction d's recurrent weights start w_stride elements after direction d - 1's (w_h:
 *   rows 3*state, row stride ldw, as above).  batch_sizes [T] is host memory, checked (a
 *   sorted pack's: >= 1, never growing, the first at most batch).  Forward: gates holds the
 *   input half on entry, the pre-activations on return; output and cells are written.
 * Backward: grad_output [N, D, state] (h_n's gradient already added at each row's last
 *   step); d_cell two [batch, D, state] buffers back to back, each holding grad_c_n on entry
 *   (work space, overwritten); d_h [batch, D, state] zeros on entry (work space); d_gates
 *   [N, D, 3*state], d_h0, d_c0 [batch, D, state] are written.
 * Backward's `parts`: 1, or p > 1 (at most 64, dividing 3*state; the directions' W_h back to
 *   back: w_stride = 3*state*ldw): each step's product d_gates_t @ W_h then runs as one strided
 *   batch of D * p products over slices of the 3*state inner dimension, whose partial results
 *   the next step's pointwise kernel adds as it reads them; d_h is then [batch, D, p, state]
 *   work space, zeros on entry.  The step at t = 0 writes d_h0 with the whole product. */
typedef int (*prl_cublas_gemm_fn)(void *handle, int transa, int transb, int m, int n, int k, const void *alpha,
                                  const void *a, int a_type, int lda, long long stride_a, const void *b, int b_type,
                                  int ldb, long long stride_b, const void *beta, void *c, int c_type, int ldc,
                                  long long stride_c, int batch_count, int compute_type, int algo);
PRL_API prl_status prl_lltm_packed_steps_forward_cuda(prl_cublas_gemm_fn gemm, void *handle, int tf32,
                                                      void *gates, const void *w_h, int64_t ldw, int64_t w_stride,
                                                      const void *h0, const void *c0, void *output, void *cells,
                                                      const int64_t *batch_sizes, int64_t steps, int64_t batch,
                                                      int64_t state, int64_t directions, int dtype, int device,
                                                      void *stream);
PRL_API prl_status prl_lltm_packed_steps_backward_cuda(prl_cublas_gemm_fn gemm, void *handle, int tf32,
                                                       const void *grad_output, const void *gates, const void *w_h,
                                                       int64_t ldw, int64_t w_stride, const void *c0,
                                                       const void *cells, void *d_cell, void *d_h, void *d_gates,
                                                       void *d_h0, void *d_c0, const int64_t *batch_sizes,
                                                       int64_t steps, int64_t batch, int64_t state,
                                                       int64_t directions, int64_t parts, int dtype, int device,
                                                       void *stream);
PRL_API prl_status prl_lltm_sequence_forward_cuda(void *gates, const void *w_h, int64_t ldw,
                                                  const void *h0, const void *c0,
                                                  void *output, void *cells, void *c_n,
                                                  int64_t steps, int64_t batch, int64_t state, int dtype,
                                                  int device, void *stream);
PRL_API prl_status prl_lltm_sequence_backward_cuda(const void *grad_output, const void *grad_c_n,
                                                   const void *gates, const void *w_h, int64_t ldw,
                                                   const void *c0, const void *cells,
                                                   void *d_gates, void *d_h0, void *d_c0,
                                                   int64_t steps, int64_t batch, int64_t state, int dtype,
                                                   int device, void *stream);
PRL_API prl_status prl_lltm_sequence_persistent_forward_cuda(const void *input, const void *weights,
                                                             const void *bias, const void *h0, const void *c0,
                                                             void *output, void *cells, void *gates, void *c_n,
                                                             int64_t steps, int64_t batch, int64_t features,
                                                             int64_t state, int dtype, int device, void *stream);

/* ---- LLTM over a short sequence, every product included (CUDA) ----
 * For short sequences of small states a call's cost is host time: each GEMM a caller
 * launches around the recurrence costs more than its work.  These two functions do it all,
 * in one plain launch (forward) and two (backward), the weights staged in shared memory:
 * the gates x_t @ W_x^T + b + h_{t-1} @ W_h^T of every step, and the input, weight and bias
 * gradients.  Every sum runs in a fixed order.
 *
 * prl_lltm_sequence_fused_cuda_fits: *fits = 1 when (batch, features, state) in `dtype`
 *   fits `device`'s shared memory, else 0 (then use prl_lltm_sequence_forward_cuda /
 *   _backward_cuda and GEMMs of your own).  The work per step grows with state + features:
 *   meant for short sequences of small states.
 * input [T, batch, features]; weights [3*state, state + features] (contiguous) and bias
 *   [3*state] as for the cell; h0, c0 [batch, state].
 * Forward (outputs): output and cells [T, batch, state] (new_h and new_cell of every
 *   step), gates [T, batch, 3*state] (the pre-activations the backward reads), c_n
 *   [batch, state] (the last new_cell once more; NULL: not written).
 * Backward: grad_output [T, batch, state], grad_c_n [batch, state] (NULL = zero), the
 *   forward's input, weights, h0, c0, output, cells and gates; outputs d_gates [T, batch,
 *   3*state] (the gradient of the pre-activations; a buffer the products read), d_input,
 *   d_weights, d_bias, d_h0 and d_c0, shaped as what they are the gradients of. */
PRL_API prl_status prl_lltm_sequence_fused_cuda_fits(int64_t batch, int64_t features, int64_t state, int dtype,
                                                     int device, int *fits);
PRL_API prl_status prl_lltm_sequence_fused_forward_cuda(const void *input, const void *weights, const void *bias,
                                                        const void *h0, const void *c0,
                                                        void *output, void *cells, void *gates, void *c_n,
                                                        int64_t steps, int64_t batch, int64_t features,
                                                        int64_t state, int dtype, int device, void *stream);
PRL_API prl_status prl_lltm_sequence_fused_backward_cuda(const void *grad_output, const void *grad_c_n,
                                                         const void *input, const void *weights,
                                                         const void *h0, const void *c0, const void *output,
                                                         const void *cells, const void *gates, void *d_gates,
                                                         void *d_input, void *d_weights, void *d_bias,
                                                         void *d_h0, void *d_c0, int64_t steps, int64_t batch,
                                                         int64_t features, int64_t state, int dtype,
                                                         int device, void *stream);

/* prl_lltm_packed_fused_forward_cuda / _backward_cuda: the fused training kernels over a
 * pack's rows (a PackedSequence's, its sequences sorted longest first): input [rows,
 * features], output and cells [rows, state], gates and d_gates [rows, 3*state], grad_output
 * and d_input shaped as output and input; first [steps] and lengths [batch], int64 in device
 * memory, as prl_lltm_layer_fused_inference_cuda reads them (not checked: the caller's to get
 * right), rows = their sum (batch <= rows <= steps * batch).  Sequence b runs exactly its
 * lengths[b] steps; c_n (grad_c_n) is its cell at (reaching) its own last step; h0, c0, d_h0,
 * d_c0 [batch, state] as above; fits as above. */
PRL_API prl_status prl_lltm_packed_fused_forward_cuda(const void *input, const void *weights, const void *bias,
                                                      const void *h0, const void *c0, const int64_t *first,
                                                      const int64_t *lengths, void *output, void *cells,
                                                      void *gates, void *c_n, int64_t steps, int64_t batch,
                                                      int64_t rows, int64_t features, int64_t state, int dtype,
                                                      int device, void *stream);
PRL_API prl_status prl_lltm_packed_fused_backward_cuda(const void *grad_output, const void *grad_c_n,
                                                       const void *input, const void *weights, const void *h0,
                                                       const void *c0, const int64_t *first,
                                                       const int64_t *lengths, const void *output,
                                                       const void *cells, const void *gates, void *d_gates,
                                                       void *d_input, void *d_weights, void *d_bias, void *d_h0,
                                                       void *d_c0, int64_t steps, int64_t batch, int64_t rows,
                                                       int64_t features, int64_t state, int dtype, int device,
                                                       void *stream);

/* prl_lltm_layer_fused_inference_cuda: a layer's forward where no backward follows, both
 * directions in one launch of the fused forward (directions = 1 or 2; fits as above, per
 * direction), nothing kept for a backward.  input [T, batch, features] (T >= 1); weights,
 * bias: the forward direction's; weights_reverse, bias_reverse: the reverse direction's
 * (read with directions = 2), which runs the sequence from step T - 1 back to step 0; h0,
 * c0 [directions, batch, state], or both NULL for zeros.  Outputs: output [T, batch,
 * directions * state] (each step's new_h, direction d at columns d*state ...: nn.LSTM's
 * layout), h_n and c_n [directions, batch, state] (each direction's last state).
 * A pack (a PackedSequence's rows, its sequences sorted longest first): first [T] and
 * lengths [batch], int64 in device memory: step t's first sequence is row first[t] of input
 * and output, and sequence b runs lengths[b] steps (lengths[0] = T, none longer than the one
 * before).  Each runs exactly its own steps, the reverse direction from its own last step,
 * and its h_n and c_n are the state there.  Both NULL: a padded batch.
 * order [batch], int64 in device memory, or NULL (the identity): the rows of h0, c0, h_n
 * and c_n that row b of the batch reads and writes are order[b] (a PackedSequence's
 * sorted_indices: the states in the caller's order, the rows in the pack's).  A permutation
 * of 0 .. batch - 1, not checked; a value out of range reads zeros and writes nothing. */
PRL_API prl_status prl_lltm_layer_fused_inference_cuda(const void *input, const void *weights, const void *bias,
                                                       const void *weights_reverse, const void *bias_reverse,
                                                       const void *h0, const void *c0, const int64_t *first,
                                                       const int64_t *lengths, const int64_t *order,
                                                       void *output, void *h_n, void *c_n, int64_t directions,
                                                       int64_t steps,
                                                       int64_t batch, int64_t features, int64_t state,
                                                       int dtype, int device, void *stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PYROUNDLIB_H_ */
