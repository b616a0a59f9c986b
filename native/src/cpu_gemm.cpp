// cpu_gemm.cpp - prl_set_cpu_gemm and prl::blas.
//
// The Fortran BLAS interface takes every argument by pointer, its integers as the BLAS
// was built: 32-bit (LP64, torch's MKL) or 64-bit (ILP64).  The library passes 64-bit
// integers, which both read right on a little-endian host while each value is below 2^31
// (an LP64 BLAS reads the low half): the sequence loops' sizes are (prl_lltm_sequence_*
// checks batch * 3 * state < 2^31).  prl_set_cpu_gemm refuses a big-endian host.
#include "cpu_gemm.h"

#include <atomic>

#include "common.h"

#if defined(_WIN32)
#include <process.h>
#define PRL_PROCESS_ID() _getpid()
#else
#include <unistd.h>
#define PRL_PROCESS_ID() getpid()
#endif

namespace {

std::atomic<prl_sgemm_fn> sgemm{nullptr};
std::atomic<prl_dgemm_fn> dgemm{nullptr};
std::atomic<long> gemm_process{0};

bool same_process() { return gemm_process.load() == (long)PRL_PROCESS_ID(); }

template <typename A, typename Fn>
void call(Fn fn, const A *a, int64_t lda, const A *b, int64_t ldb, bool b_transposed, A *c, int64_t ldc, int64_t m,
          int64_t n, int64_t k) {
    // Row-major c = a @ op(b) is column-major c^T = op(b)^T @ a^T: the BLAS's first operand
    // is b (as column-major it is b^T, or b itself when b_transposed), the second a.
    const char trans_b = b_transposed ? 'T' : 'N', trans_a = 'N';
    const A one = 1, zero = 0;
    fn(&trans_b, &trans_a, &n, &m, &k, &one, b, &ldb, a, &lda, &zero, c, &ldc);
}

}  // namespace

namespace prl {

template <> Blas<float> blas<float>() { return Blas<float>{same_process() ? (const void *)sgemm.load() : nullptr}; }
template <> Blas<double> blas<double>() { return Blas<double>{same_process() ? (const void *)dgemm.load() : nullptr}; }

template <>
void Blas<float>::product(const float *a, int64_t lda, const float *b, int64_t ldb, bool b_transposed, float *c,
                          int64_t ldc, int64_t m, int64_t n, int64_t k) const {
    call(reinterpret_cast<prl_sgemm_fn>(const_cast<void *>(fn)), a, lda, b, ldb, b_transposed, c, ldc, m, n, k);
}

template <>
void Blas<double>::product(const double *a, int64_t lda, const double *b, int64_t ldb, bool b_transposed, double *c,
                           int64_t ldc, int64_t m, int64_t n, int64_t k) const {
    call(reinterpret_cast<prl_dgemm_fn>(const_cast<void *>(fn)), a, lda, b, ldb, b_transposed, c, ldc, m, n, k);
}

}  // namespace prl

extern "C" PRL_API prl_status prl_set_cpu_gemm(prl_sgemm_fn s, prl_dgemm_fn d) {
    const uint16_t probe = 1;
    if ((s != nullptr || d != nullptr) && *reinterpret_cast<const unsigned char *>(&probe) != 1)
        return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: a BLAS can be handed over on little-endian hosts only",
                         __func__);
    gemm_process.store((long)PRL_PROCESS_ID());
    sgemm.store(s);
    dgemm.store(d);
    return PRL_SUCCESS;
}
