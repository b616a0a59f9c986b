// cuda_workload.cu - every CUDA entry point on device buffers, with no torch in the
// process, for compute-sanitizer (make cuda-sanitize): memcheck, racecheck, synccheck,
// and initcheck, which also proves that every output element is written (the outputs
// are copied back whole; a slot no kernel wrote would be an uninitialized read).
// Results are compared with the CPU entry points.  Exits 77 (ctest: skipped) without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "pyroundlib.h"

static int failures = 0;
#define CHECK(cond)                                                                         \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            std::fprintf(stderr, "%s:%d: CHECK failed: %s (%s)\n", __FILE__, __LINE__, #cond, prl_last_error()); \
            ++failures;                                                                     \
        }                                                                                   \
    } while (0)

template <typename T> static T *to_device(const std::vector<T> &host) {
    T *p = nullptr;
    cudaMalloc(&p, host.size() * sizeof(T) + 64);
    cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
    return p;
}

template <typename T> static std::vector<T> to_host(const T *device, size_t n) {
    std::vector<T> host(n);
    cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
}

// Random values of type T; 16-bit types get arbitrary bit patterns (all are valid halves/bfloat16s).
template <typename T> static std::vector<T> random_values(size_t n, double scale) {
    std::vector<T> v(n);
    for (auto &x : v) {
        if (sizeof(T) == 2) {
            uint16_t bits = (uint16_t)(std::rand() & 0xffff);
            std::memcpy(&x, &bits, 2);
        } else {
            x = (T)((std::rand() / (double)RAND_MAX - 0.5) * scale);
        }
    }
    return v;
}

template <typename T> static void round_case(int dtype, size_t n, size_t offset, cudaStream_t stream) {
    auto host = random_values<T>(n + offset, 20.0);
    T *x = to_device(host), *y = nullptr;
    cudaMalloc(&y, (n + offset) * sizeof(T));
    CHECK(prl_round_cuda(x + offset, y + offset, (int64_t)n, dtype, 0, stream) == PRL_SUCCESS);
    cudaStreamSynchronize(stream);
    auto got = to_host(y + offset, n);
    std::vector<T> want(n);
    CHECK(prl_round_cpu(host.data() + offset, want.data(), (int64_t)n, dtype) == PRL_SUCCESS);
    for (size_t i = 0; i < n; ++i) {
        const bool nan_both = sizeof(T) >= 4 && std::isnan((double)got[i]) && std::isnan((double)want[i]);
        if (!nan_both && sizeof(T) >= 4) CHECK(std::memcmp(&got[i], &want[i], sizeof(T)) == 0);
    }
    cudaFree(x);
    cudaFree(y);
}

template <typename T> static void lltm_case(int dtype, int64_t batch, int64_t state, bool with_grad_h) {
    const size_t n = (size_t)(batch * state), g = 3 * n;
    auto gates = random_values<T>(g, 6.0), cell = random_values<T>(n, 2.0), grad = random_values<T>(n, 1.0);
    if (sizeof(T) == 2) {  // 16-bit: zeros (here the sanitizer checks accesses; the Python tests check values)
        gates = std::vector<T>(g);
        cell = std::vector<T>(n);
        grad = std::vector<T>(n);
    }
    T *d_gates = to_device(gates), *d_cell = to_device(cell), *d_grad = to_device(grad);
    T *h, *c, *dg, *dc, *dg2, *dc2, *db;
    cudaMalloc(&h, n * sizeof(T));
    cudaMalloc(&c, n * sizeof(T));
    cudaMalloc(&dg, g * sizeof(T));
    cudaMalloc(&dc, n * sizeof(T));
    cudaMalloc(&dg2, g * sizeof(T));
    cudaMalloc(&dc2, n * sizeof(T));
    cudaMalloc(&db, 3 * state * sizeof(T));
    CHECK(prl_lltm_forward_cuda(d_gates, d_cell, h, c, batch, state, dtype, 0, nullptr) == PRL_SUCCESS);
    CHECK(prl_lltm_backward_cuda(with_grad_h ? d_grad : nullptr, d_grad, d_gates, d_cell, dg, dc, nullptr, batch, state,
                                 dtype, 0, nullptr) == PRL_SUCCESS);
    // the fused bias-gradient kernel (shared memory: racecheck has something to check)
    CHECK(prl_lltm_backward_cuda(with_grad_h ? d_grad : nullptr, d_grad, d_gates, d_cell, dg2, dc2, db, batch, state,
                                 dtype, 0, nullptr) == PRL_SUCCESS);
    cudaDeviceSynchronize();
    auto got_h = to_host(h, n), got_c = to_host(c, n), got_dg = to_host(dg, g), got_dc = to_host(dc, n);
    auto got_dg2 = to_host(dg2, g), got_dc2 = to_host(dc2, n), got_db = to_host(db, 3 * state);
    std::vector<T> want_h(n), want_c(n), want_dg(g), want_dc(n), want_db(3 * state);
    CHECK(prl_lltm_forward_cpu(gates.data(), cell.data(), want_h.data(), want_c.data(), batch, state, dtype) ==
          PRL_SUCCESS);
    CHECK(prl_lltm_backward_cpu(with_grad_h ? grad.data() : nullptr, grad.data(), gates.data(), cell.data(),
                                want_dg.data(), want_dc.data(), want_db.data(), batch, state, dtype) == PRL_SUCCESS);
    if (sizeof(T) >= 4) {
        for (size_t i = 0; i < n; ++i) {
            CHECK(std::fabs((double)got_h[i] - (double)want_h[i]) < 1e-4);
            CHECK(std::fabs((double)got_c[i] - (double)want_c[i]) < 1e-4 * (1 + std::fabs((double)want_c[i])));
            CHECK(std::fabs((double)got_dc[i] - (double)want_dc[i]) < 1e-4 * (1 + std::fabs((double)want_dc[i])));
            CHECK(std::fabs((double)got_dc2[i] - (double)want_dc[i]) < 1e-4 * (1 + std::fabs((double)want_dc[i])));
        }
        for (size_t i = 0; i < g; ++i)
            CHECK(std::fabs((double)got_dg2[i] - (double)got_dg[i]) < 1e-4 * (1 + std::fabs((double)got_dg[i])));
        for (size_t j = 0; j < (size_t)(3 * state); ++j)  // sums of up to `batch` terms: a looser bound
            CHECK(std::fabs((double)got_db[j] - (double)want_db[j]) < 1e-4 * (1 + std::fabs((double)want_db[j])) * batch);
    }
    for (T *p : {d_gates, d_cell, d_grad, h, c, dg, dc, dg2, dc2, db}) cudaFree(p);
}

// The persistent sequence kernels (shared memory, a grid-wide or a block barrier) and the input half before
// them: statuses here; the
// Python tests check the values against a float64 reference.
template <typename T> static void sequence_case(int dtype, int64_t steps, int64_t batch, int64_t state) {
    const int64_t ldw = state + 3, cell = batch * state, n = steps * cell;
    int fits = 0;
    CHECK(prl_lltm_sequence_cuda_fits(batch, state, dtype, 0, &fits) == PRL_SUCCESS);
    if (!fits) return;
    auto gates = to_device(random_values<T>((size_t)(3 * n), 1.0)), w = to_device(random_values<T>((size_t)(3 * state * ldw), 0.2));
    auto h0 = to_device(random_values<T>((size_t)cell, 1.0)), c0 = to_device(random_values<T>((size_t)cell, 1.0));
    auto grad = to_device(random_values<T>((size_t)n, 1.0)), grad_c = to_device(random_values<T>((size_t)cell, 1.0));
    auto x = to_device(random_values<T>((size_t)(steps * batch * (ldw - state)), 1.0));
    auto bias = to_device(random_values<T>((size_t)(3 * state), 0.2));
    T *out, *cells, *c_n, *dg, *dh0, *dc0;
    cudaMalloc(&out, n * sizeof(T));
    cudaMalloc(&c_n, cell * sizeof(T));
    cudaMalloc(&cells, n * sizeof(T));
    cudaMalloc(&dg, 3 * n * sizeof(T));
    cudaMalloc(&dh0, cell * sizeof(T));
    cudaMalloc(&dc0, cell * sizeof(T));
    CHECK(prl_lltm_sequence_forward_cuda(gates, w, ldw, h0, c0, out, cells, c_n, steps, batch, state, dtype, 0,
                                         nullptr) == PRL_SUCCESS);
    CHECK(prl_lltm_sequence_backward_cuda(grad, grad_c, gates, w, ldw, c0, cells, dg, dh0, dc0, steps, batch, state,
                                          dtype, 0, nullptr) == PRL_SUCCESS);
    CHECK(prl_lltm_sequence_backward_cuda(grad, nullptr, gates, w, ldw, c0, cells, dg, dh0, dc0, steps, batch, state,
                                          dtype, 0, nullptr) == PRL_SUCCESS);
    std::vector<T> last(cell), again(cell);  // c_n repeats the last step's cells bit for bit
    for (int whole = 0; whole < 2; ++whole) {  // then the whole forward: the input half (a tiled product) first
        if (whole)
            CHECK(prl_lltm_sequence_persistent_forward_cuda(x, w, bias, h0, c0, out, cells, gates, c_n, steps, batch,
                                                            ldw - state, state, dtype, 0, nullptr) == PRL_SUCCESS);
        CHECK(cudaDeviceSynchronize() == cudaSuccess);
        cudaMemcpy(last.data(), cells + (steps - 1) * cell, cell * sizeof(T), cudaMemcpyDeviceToHost);
        cudaMemcpy(again.data(), c_n, cell * sizeof(T), cudaMemcpyDeviceToHost);
        CHECK(std::memcmp(last.data(), again.data(), cell * sizeof(T)) == 0);
    }
    for (T *p : {gates, w, h0, c0, grad, grad_c, out, cells, c_n, dg, dh0, dc0, x, bias}) cudaFree(p);
}

// The fused sequence kernels (weights and rows in shared memory, the lanes of each output
// meeting by shuffles): statuses here; the Python tests check the values.
template <typename T>
static void fused_case(int dtype, int64_t steps, int64_t batch, int64_t features, int64_t state) {
    int fits = 0;
    CHECK(prl_lltm_sequence_fused_cuda_fits(batch, features, state, dtype, 0, &fits) == PRL_SUCCESS);
    if (!fits) return;
    const int64_t cell = batch * state, n = steps * cell, nx = steps * batch * features;
    const int64_t nw = 3 * state * (state + features);
    auto x = to_device(random_values<T>((size_t)nx, 1.0)), w = to_device(random_values<T>((size_t)nw, 0.2));
    auto bias = to_device(random_values<T>((size_t)(3 * state), 0.2));
    auto h0 = to_device(random_values<T>((size_t)cell, 1.0)), c0 = to_device(random_values<T>((size_t)cell, 1.0));
    auto grad = to_device(random_values<T>((size_t)n, 1.0)), grad_c = to_device(random_values<T>((size_t)cell, 1.0));
    T *out, *cells, *gates, *c_n, *dg, *dx, *dw, *db, *dh0, *dc0;
    for (auto [p, count] : {std::pair<T **, int64_t>{&out, n}, {&cells, n}, {&gates, 3 * n}, {&c_n, cell},
                            {&dg, 3 * n}, {&dx, nx}, {&dw, nw}, {&db, 3 * state}, {&dh0, cell}, {&dc0, cell}})
        cudaMalloc(p, (size_t)count * sizeof(T));
    CHECK(prl_lltm_sequence_fused_forward_cuda(x, w, bias, h0, c0, out, cells, gates, c_n, steps, batch, features,
                                               state, dtype, 0, nullptr) == PRL_SUCCESS);
    CHECK(prl_lltm_sequence_fused_backward_cuda(grad, grad_c, x, w, h0, c0, out, cells, gates, dg, dx, dw, db, dh0,
                                                dc0, steps, batch, features, state, dtype, 0, nullptr) == PRL_SUCCESS);
    // a layer's two directions in one launch (only the launch is checked: the weights shared),
    // the reverse direction reading x backwards: states [2, batch, state], output [steps, batch, 2 state]
    auto h2 = to_device(random_values<T>((size_t)(2 * cell), 1.0));
    auto c2 = to_device(random_values<T>((size_t)(2 * cell), 1.0));
    T *out2, *h_n2, *c_n2;
    for (auto [p, count] : {std::pair<T **, int64_t>{&out2, 2 * n}, {&h_n2, 2 * cell}, {&c_n2, 2 * cell}})
        cudaMalloc(p, (size_t)count * sizeof(T));
    CHECK(prl_lltm_layer_fused_inference_cuda(x, w, bias, w, bias, h2, c2, nullptr, nullptr, nullptr, out2, h_n2,
                                              c_n2, 2, steps, batch, features, state, dtype, 0, nullptr)
          == PRL_SUCCESS);
    // the same rows as a pack: sequence b runs steps - b % steps steps, sorted longest first
    std::vector<int64_t> lengths((size_t)batch), first((size_t)steps);
    for (int64_t b = 0; b < batch; ++b) lengths[(size_t)b] = std::max<int64_t>(1, steps - b);
    for (int64_t t = 0, row = 0; t < steps; ++t) {
        first[(size_t)t] = row;
        for (int64_t b = 0; b < batch; ++b) row += lengths[(size_t)b] > t;
    }
    std::vector<int64_t> order((size_t)batch);  // the states in the caller's order: here the batch reversed
    for (int64_t b = 0; b < batch; ++b) order[(size_t)b] = batch - 1 - b;
    int64_t *first_d, *lengths_d, *order_d;
    cudaMalloc(&first_d, (size_t)steps * sizeof(int64_t));
    cudaMalloc(&lengths_d, (size_t)batch * sizeof(int64_t));
    cudaMalloc(&order_d, (size_t)batch * sizeof(int64_t));
    cudaMemcpy(first_d, first.data(), (size_t)steps * sizeof(int64_t), cudaMemcpyHostToDevice);
    cudaMemcpy(lengths_d, lengths.data(), (size_t)batch * sizeof(int64_t), cudaMemcpyHostToDevice);
    cudaMemcpy(order_d, order.data(), (size_t)batch * sizeof(int64_t), cudaMemcpyHostToDevice);
    CHECK(prl_lltm_layer_fused_inference_cuda(x, w, bias, w, bias, h2, c2, first_d, lengths_d, order_d, out2, h_n2,
                                              c_n2, 2, steps, batch, features, state, dtype, 0, nullptr)
          == PRL_SUCCESS);
    // the training kernels over the same pack's rows (the buffers above are at least that long)
    int64_t rows = 0;
    for (int64_t length : lengths) rows += length;
    CHECK(prl_lltm_packed_fused_forward_cuda(x, w, bias, h0, c0, first_d, lengths_d, out, cells, gates, c_n, steps,
                                             batch, rows, features, state, dtype, 0, nullptr) == PRL_SUCCESS);
    CHECK(prl_lltm_packed_fused_backward_cuda(grad, grad_c, x, w, h0, c0, first_d, lengths_d, out, cells, gates, dg,
                                              dx, dw, db, dh0, dc0, steps, batch, rows, features, state, dtype, 0,
                                              nullptr) == PRL_SUCCESS);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    for (T *p : {x, w, bias, h0, c0, grad, grad_c, out, cells, gates, c_n, dg, dx, dw, db, dh0, dc0}) cudaFree(p);
    for (T *p : {h2, c2, out2, h_n2, c_n2}) cudaFree(p);
    cudaFree(first_d);
    cudaFree(lengths_d);
    cudaFree(order_d);
}

int main() {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0 || !prl_has_cuda()) {
        std::printf("cuda_workload: no GPU (or a CPU-only library): skipped\n");
        return 77;
    }
    cudaStream_t stream;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    for (size_t n : {1u, 7u, 4099u, 65539u})
        for (size_t offset : {0u, 1u}) {  // offset 1: unaligned, the scalar path
            round_case<float>(PRL_FLOAT32, n, offset, stream);
            round_case<double>(PRL_FLOAT64, n, offset, stream);
            round_case<uint16_t>(PRL_FLOAT16, n, offset, stream);
            round_case<uint16_t>(PRL_BFLOAT16, n, offset, stream);
        }
    for (int64_t state : {128, 33, 8})  // vectorised (128, 8 for 16-bit) and scalar (33)
        for (bool with_grad_h : {true, false}) {
            lltm_case<float>(PRL_FLOAT32, 37, state, with_grad_h);
            lltm_case<double>(PRL_FLOAT64, 5, state, with_grad_h);
            lltm_case<uint16_t>(PRL_FLOAT16, 9, state, with_grad_h);
            lltm_case<uint16_t>(PRL_BFLOAT16, 9, state, with_grad_h);
        }
    // float32: one column tile at 64 (the kernel for that size) and 33, a cluster, the grid barrier
    for (int64_t state : {64, 33, 100, 300}) {
        sequence_case<float>(PRL_FLOAT32, 4, 7, state);
        sequence_case<double>(PRL_FLOAT64, 3, 5, state);
    }
    // 16-bit: the tensor cores' tiles on sm_80+ (one column tile up to 128, 128 the kernel for that
    // size, clusters of 10 and 4 at 300 and 256, the grid barrier at 520), then the CUDA cores' (the
    // plans are per setting)
    for (const char *tensor_cores : {"1", "0"}) {
        setenv("PYROUNDLIB_TENSOR_CORES", tensor_cores, 1);
        for (int64_t state : {64, 128, 33, 100, 300, 256, 520}) {
            sequence_case<uint16_t>(PRL_BFLOAT16, 3, 9, state);
            sequence_case<uint16_t>(PRL_FLOAT16, 2, 5, state);
        }
    }
    unsetenv("PYROUNDLIB_TENSOR_CORES");
    // 16-bit, a batch too wide for one (row, column) pair a thread: rows of two pairs a thread
    // (prl_lltm_sequence_cuda_fits: 2, on a GPU of fewer than 192 SMs)
    sequence_case<uint16_t>(PRL_BFLOAT16, 2, 64, 768);
    sequence_case<uint16_t>(PRL_FLOAT16, 2, 64, 768);
    // lanes an output / rows a block: 4 / 1 at 64 and 33, 2 / 1 at 100, 1 / 1 at 130, 4 / 7 at 8; a last
    // warp part empty at 33, 100 and 130
    for (int64_t state : {64, 33, 100, 130, 8}) {
        fused_case<float>(PRL_FLOAT32, 3, 7, 3, state);
        fused_case<uint16_t>(PRL_BFLOAT16, 2, 7, 3, state);
    }
    cudaStreamDestroy(stream);
    const cudaError_t err = cudaDeviceSynchronize();
    CHECK(err == cudaSuccess);
    if (failures) {
        std::fprintf(stderr, "cuda_workload: %d check(s) failed\n", failures);
        return 1;
    }
    std::printf("cuda_workload: all checks passed\n");
    return 0;
}
