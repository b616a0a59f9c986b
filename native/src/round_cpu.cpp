// round_cpu.cpp - prl_round_cpu: chunks of the array on up to prl_cpu_threads() threads.
#include <type_traits>

#include "cpu_threads.h"
#include "round.h"

#if defined(PRL_CPU_MULTIVERSION) && defined(__x86_64__)
#include <immintrin.h>
#define PRL_HAVE_F16C_PATH 1
#endif

namespace {
template <typename T> PRL_CPU_CLONES void round_cpu(const T *x, T *y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = prl::round_element(x[i]);
}

#if defined(PRL_HAVE_F16C_PATH)
// x86-64-v3 and up (AVX2, F16C): ROUNDPS / ROUNDPD, which round half to even in one
// instruction, as torch's own loops do.  The portable loop's branch-free rint (add and
// subtract 2^23, put the sign back, keep |x| >= 2^23) takes ~6 vector instructions for
// one, its 16-bit loads and stores more: alone it took 1.25-1.8x torch.round's time on
// arrays in cache (benchmarks/NOTES.md).  Same bits, but that a signalling NaN comes back
// quiet (a NaN stays a NaN).  Two vectors an iteration; the last few elements, the
// portable loop.
constexpr int kRoundMode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

__attribute__((target("avx2"))) void round_float_avx2(const float *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        _mm256_storeu_ps(y + i, _mm256_round_ps(a, kRoundMode));
        _mm256_storeu_ps(y + i + 8, _mm256_round_ps(b, kRoundMode));
    }
    round_cpu(x + i, y + i, n - i);
}

__attribute__((target("avx2"))) void round_double_avx2(const double *x, double *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256d a = _mm256_loadu_pd(x + i), b = _mm256_loadu_pd(x + i + 4);
        _mm256_storeu_pd(y + i, _mm256_round_pd(a, kRoundMode));
        _mm256_storeu_pd(y + i + 4, _mm256_round_pd(b, kRoundMode));
    }
    round_cpu(x + i, y + i, n - i);
}

// bfloat16: a float's top half, so widened by a shift, and a rounded value (an integer,
// an infinity or a quiet NaN) narrowed exactly by the shift back.
__attribute__((target("avx2"))) __m256i round_bfloat16_8(const prl::bfloat16_t *x) {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i *>(x));
    const __m256i wide = _mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16);
    const __m256 r = _mm256_round_ps(_mm256_castsi256_ps(wide), kRoundMode);
    return _mm256_srli_epi32(_mm256_castps_si256(r), 16);
}

__attribute__((target("avx2"))) void round_bfloat16_avx2(const prl::bfloat16_t *x, prl::bfloat16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        // packus packs within each 128-bit lane: the permute puts the 16 results in order
        const __m256i packed = _mm256_packus_epi32(round_bfloat16_8(x + i), round_bfloat16_8(x + i + 8));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(y + i), _mm256_permute4x64_epi64(packed, 0xd8));
    }
    round_cpu(x + i, y + i, n - i);
}

// float16 with the F16C conversions, exact both ways for every rounded value.
__attribute__((target("avx2,f16c"))) void round_half_f16c(const prl::half_t *x, prl::half_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(x + i)));
        const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(x + i + 8)));
        _mm_storeu_si128(reinterpret_cast<__m128i *>(y + i),
                         _mm256_cvtps_ph(_mm256_round_ps(a, kRoundMode), _MM_FROUND_TO_NEAREST_INT));
        _mm_storeu_si128(reinterpret_cast<__m128i *>(y + i + 8),
                         _mm256_cvtps_ph(_mm256_round_ps(b, kRoundMode), _MM_FROUND_TO_NEAREST_INT));
    }
    round_cpu(x + i, y + i, n - i);
}

bool have_avx2_f16c() {
    static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    return yes;
}
#endif

template <typename T> void round_range(const T *x, T *y, int64_t n) {
#if defined(PRL_HAVE_F16C_PATH)
    if (have_avx2_f16c()) {
        if constexpr (std::is_same_v<T, float>) return round_float_avx2(x, y, n);
        if constexpr (std::is_same_v<T, double>) return round_double_avx2(x, y, n);
        if constexpr (std::is_same_v<T, prl::bfloat16_t>) return round_bfloat16_avx2(x, y, n);
        if constexpr (std::is_same_v<T, prl::half_t>) return round_half_f16c(x, y, n);
    }
#endif
    round_cpu(x, y, n);
}
}  // namespace

extern "C" PRL_API prl_status prl_round_cpu(const void *x, void *y, int64_t n, int dtype) {
    PRL_API_BEGIN
    const char *fn = __func__;
    PRL_TRY(prl::check_round_args(fn, x, y, n));
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        const T *in = static_cast<const T *>(x);
        T *out = static_cast<T *>(y);
        prl::run_chunks(n, prl::kGrain,
                        [&](int64_t begin, int64_t end) { round_range(in + begin, out + begin, end - begin); });
        return PRL_SUCCESS;
    });
    PRL_API_END
}
