// prototype: C[d] = A[d] (MxK, lda) * op(B[d]) (+ C if accumulate), float32, fixed-order sums
#include <cuda_runtime.h>
#include <cstdint>
template <int BM, int BN, bool NT>
__global__ void __launch_bounds__(BM * BN / 16) gemm_kernel(const float *__restrict__ A, int64_t lda, int64_t strideA,
    const float *__restrict__ B, int64_t ldb, int64_t strideB, float *__restrict__ C, int64_t ldc, int64_t strideC,
    int M, int N, int K, int accumulate, int tiles_n) {
    constexpr int BK = 16, THREADS = BM * BN / 16, TX = BN / 4;
    __shared__ __align__(16) float As[2][BK][BM + 4];
    __shared__ __align__(16) float Bs[2][BK][BN + 4];
    const int d = blockIdx.y;
    A += d * strideA; B += d * strideB; C += d * strideC;
    const int m0 = (blockIdx.x / tiles_n) * BM, n0 = (blockIdx.x % tiles_n) * BN;
    const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
    // staging: A tile BM x BK: each thread loads BM*BK/THREADS elements; B tile BK x BN likewise
    constexpr int AL = BM * BK / THREADS, BL = BK * BN / THREADS;
    float ra[AL], rb[BL];
    auto load = [&](int k0) {
#pragma unroll
        for (int i = 0; i < AL; ++i) {
            const int e = tid + i * THREADS, r = e / BK, k = e % BK;  // consecutive threads: consecutive k
            ra[i] = (m0 + r < M && k0 + k < K) ? A[(int64_t)(m0 + r) * lda + k0 + k] : 0.f;
        }
#pragma unroll
        for (int i = 0; i < BL; ++i) {
            const int e = tid + i * THREADS;
            int k, n;
            if (NT) { n = e / BK; k = e % BK; } else { k = e / BN; n = e % BN; }
            const bool in = n0 + n < N && k0 + k < K;
            rb[i] = in ? (NT ? B[(int64_t)(n0 + n) * ldb + k0 + k] : B[(int64_t)(k0 + k) * ldb + n0 + n]) : 0.f;
        }
    };
    auto store = [&](int buf) {
#pragma unroll
        for (int i = 0; i < AL; ++i) { const int e = tid + i * THREADS; As[buf][e % BK][e / BK] = ra[i]; }
#pragma unroll
        for (int i = 0; i < BL; ++i) {
            const int e = tid + i * THREADS;
            if (NT) Bs[buf][e % BK][e / BK] = rb[i]; else Bs[buf][e / BN][e % BN] = rb[i];
        }
    };
    float acc[4][4] = {};
    load(0); store(0); __syncthreads();
    int buf = 0;
    for (int k0 = 0; k0 < K; k0 += BK) {
        const bool more = k0 + BK < K;
        if (more) load(k0 + BK);
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            const float4 a = *reinterpret_cast<const float4 *>(&As[buf][kk][ty * 4]);
            const float4 b = *reinterpret_cast<const float4 *>(&Bs[buf][kk][tx * 4]);
            const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        if (more) { store(buf ^ 1); __syncthreads(); buf ^= 1; }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int m = m0 + ty * 4 + i;
        if (m >= M) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int n = n0 + tx * 4 + j;
            if (n < N) { float *c = C + (int64_t)m * ldc + n; *c = accumulate ? *c + acc[i][j] : acc[i][j]; }
        }
    }
}
template <int BM, int BN, bool NT> static int run(const float *A, int64_t lda, int64_t sA, const float *B, int64_t ldb, int64_t sB,
    float *C, int64_t ldc, int64_t sC, int M, int N, int K, int D, int acc, void *stream) {
    const int tn = (N + BN - 1) / BN, tm = (M + BM - 1) / BM;
    gemm_kernel<BM, BN, NT><<<dim3(tm * tn, D), BM * BN / 16, 0, (cudaStream_t)stream>>>(A, lda, sA, B, ldb, sB, C, ldc, sC, M, N, K, acc, tn);
    return (int)cudaGetLastError();
}
extern "C" int proto_gemm(int tile, int nt, const float *A, int64_t lda, int64_t sA, const float *B, int64_t ldb, int64_t sB,
    float *C, int64_t ldc, int64_t sC, int M, int N, int K, int D, int acc, void *stream) {
    if (tile == 0) return nt ? run<32, 64, true>(A, lda, sA, B, ldb, sB, C, ldc, sC, M, N, K, D, acc, stream) : run<32, 64, false>(A, lda, sA, B, ldb, sB, C, ldc, sC, M, N, K, D, acc, stream);
    if (tile == 1) return nt ? run<32, 32, true>(A, lda, sA, B, ldb, sB, C, ldc, sC, M, N, K, D, acc, stream) : run<32, 32, false>(A, lda, sA, B, ldb, sB, C, ldc, sC, M, N, K, D, acc, stream);
    if (tile == 2) return nt ? run<64, 64, true>(A, lda, sA, B, ldb, sB, C, ldc, sC, M, N, K, D, acc, stream) : run<64, 64, false>(A, lda, sA, B, ldb, sB, C, ldc, sC, M, N, K, D, acc, stream);
    return nt ? run<16, 64, true>(A, lda, sA, B, ldb, sB, C, ldc, sC, M, N, K, D, acc, stream) : run<16, 64, false>(A, lda, sA, B, ldb, sB, C, ldc, sC, M, N, K, D, acc, stream);
}
