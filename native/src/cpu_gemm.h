// cpu_gemm.h - the BLAS the CPU sequence loops multiply with, where the caller handed one
// over (prl_set_cpu_gemm): the sgemm_/dgemm_ of a BLAS already loaded into the process
// (torch's MKL).  Its products are as fast as torch's own (they are torch's own), and
// threaded by the BLAS on the threads torch's GEMMs run on.  Without one, the loops use
// the library's register-tiled product (lltm_sequence_cpu.cpp).
#pragma once

#include <stdint.h>

namespace prl {

// The BLAS handed over for the arithmetic type A (float: sgemm_, double: dgemm_), as it was
// when blas<A>() was called: empty where none was, or where it was handed over in another
// process (a forked child: the BLAS's OpenMP threads are the parent's).
template <typename A> struct Blas {
    const void *fn = nullptr;
    explicit operator bool() const { return fn != nullptr; }
    // c[m, n] = a[m, k] @ op(b), all row-major (row strides lda, ldc): op(b) = b [k, n] (row
    // stride ldb), or with b_transposed, b^T for b [n, k] (row stride ldb).
    void product(const A *a, int64_t lda, const A *b, int64_t ldb, bool b_transposed, A *c, int64_t ldc, int64_t m,
                 int64_t n, int64_t k) const;
};
template <typename A> Blas<A> blas();

}  // namespace prl
