// scalar.h - element types and the arithmetic shared by the CPU loops and the CUDA kernels.
//
// Every per-element function in this library is written once, as a PRL_HD function
// over an arithmetic type `acc_t<T>` (float for float32/float16/bfloat16 storage,
// double for float64), and called from both a CPU loop and a CUDA grid-stride loop.
// 16-bit storage types are plain structs of bits, so the CPU build needs no CUDA
// header; on the device their conversions use the hardware instructions.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#  include <cuda_bf16.h>
#  include <cuda_fp16.h>
#  define PRL_HD __host__ __device__ __forceinline__
#elif defined(__GNUC__)
#  define PRL_HD inline __attribute__((always_inline))  // inlined into the loops, which then vectorise
#else
#  define PRL_HD inline
#endif

namespace prl {

struct half_t { uint16_t bits; };      // IEEE binary16 storage
struct bfloat16_t { uint16_t bits; };  // bfloat16 storage

template <typename T> struct acc_type { using type = T; };
template <> struct acc_type<half_t> { using type = float; };
template <> struct acc_type<bfloat16_t> { using type = float; };
template <typename T> using acc_t = typename acc_type<T>::type;

PRL_HD uint32_t float_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
PRL_HD float bits_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

// ---- binary16 <-> float (software on the host, one instruction on the device) ----
PRL_HD float half_to_float(half_t h) {
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(h.bits));
#else
    // every case computed, one chosen: no branch, so the loops that call it vectorise
    const uint32_t sign = (uint32_t)(h.bits & 0x8000u) << 16;
    const uint32_t exp = (h.bits >> 10) & 0x1fu, mant = h.bits & 0x3ffu;
    const uint32_t special = sign | 0x7f800000u | (mant << 13);                          // inf, NaN
    const uint32_t subnormal = sign | float_bits((float)mant * 5.9604644775390625e-8f);  // mant * 2^-24, exact
    const uint32_t normal = sign | ((exp + 112u) << 23) | (mant << 13);                   // rebias 15 -> 127
    return bits_float(exp == 0x1fu ? special : exp == 0 ? subnormal : normal);
#endif
}

PRL_HD half_t float_to_half(float f) {  // round to nearest, ties to even
#if defined(__CUDA_ARCH__)
    return half_t{__half_as_ushort(__float2half_rn(f))};
#else
    const uint32_t x = float_bits(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return half_t{(uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu))};  // NaN stays NaN
    if (a >= 0x477ff000u) return half_t{(uint16_t)(sign | 0x7c00u)};  // >= 65520 (and inf) -> inf
    if (a >= 0x38800000u) {                                           // normal binary16
        const uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);
        return half_t{(uint16_t)(sign | ((rounded - 0x38000000u) >> 13))};
    }
    if (a < 0x33000000u) return half_t{sign};  // below 2^-25: rounds to (signed) zero
    // subnormal binary16: the value in units of 2^-24, rounded to nearest even
    const uint32_t shift = 126u - (a >> 23);   // 14..24
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
    return half_t{(uint16_t)(sign | q)};
#endif
}

// ---- bfloat16 <-> float ----------------------------------------------------------
PRL_HD float bfloat16_to_float(bfloat16_t b) { return bits_float((uint32_t)b.bits << 16); }

PRL_HD bfloat16_t float_to_bfloat16(float f) {  // round to nearest, ties to even
#if defined(__CUDA_ARCH__)
    return bfloat16_t{__bfloat16_as_ushort(__float2bfloat16_rn(f))};
#else
    const uint32_t x = float_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return bfloat16_t{(uint16_t)((x >> 16) | 0x40u)};  // quiet NaN
    return bfloat16_t{(uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16)};
#endif
}

// ---- load a stored element into its arithmetic type, and store it back -------------
PRL_HD float load(float v) { return v; }
PRL_HD double load(double v) { return v; }
PRL_HD float load(half_t v) { return half_to_float(v); }
PRL_HD float load(bfloat16_t v) { return bfloat16_to_float(v); }

template <typename T> PRL_HD T store(acc_t<T> v);
template <> PRL_HD float store<float>(float v) { return v; }
template <> PRL_HD double store<double>(double v) { return v; }
template <> PRL_HD half_t store<half_t>(float v) { return float_to_half(v); }
template <> PRL_HD bfloat16_t store<bfloat16_t>(float v) { return float_to_bfloat16(v); }

// store_integral: store<T> of a value that is an integer, an infinity or a NaN that came
// from a T (a rounded element): exact, so for binary16 on the host a conversion with no
// rounding and no branch (the round's loop vectorises), the same bits as float_to_half.
template <typename T> PRL_HD T store_integral(acc_t<T> v) { return store<T>(v); }
template <> PRL_HD half_t store_integral<half_t>(float v) {
#if defined(__CUDA_ARCH__)
    return store<half_t>(v);
#else
    const uint32_t x = float_bits(v), sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    const uint32_t finite = a == 0 ? 0u : (a - 0x38000000u) >> 13;                     // 0, or >= 1: normal
    const uint32_t special = 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0u);  // inf, quiet NaN
    return half_t{(uint16_t)(sign | (a >= 0x7f800000u ? special : finite))};
#endif
}
template <> PRL_HD bfloat16_t store_integral<bfloat16_t>(float v) {
#if defined(__CUDA_ARCH__)
    return store<bfloat16_t>(v);
#else
    const uint32_t x = float_bits(v);  // the low half is zero but for a NaN's payload
    return bfloat16_t{(uint16_t)((x >> 16) | ((x & 0x7fffffffu) > 0x7f800000u ? 0x40u : 0u))};
#endif
}

// ---- V consecutive elements, moved as one access (16 bytes on the GPU) ------------------
template <typename T, int V> struct alignas(sizeof(T) * V) Vec { T v[V]; };

template <int V, typename T> PRL_HD Vec<T, V> load_vec(const T *p) {
#if defined(__CUDA_ARCH__)
    return *reinterpret_cast<const Vec<T, V> *>(p);  // one LDG.128 when V * sizeof(T) == 16
#else
    Vec<T, V> r;
    for (int j = 0; j < V; ++j) r.v[j] = p[j];  // element-typed accesses: plain loads the host vectoriser follows
    return r;
#endif
}

template <int V, typename T> PRL_HD void store_vec(T *p, const Vec<T, V> &value) {
#if defined(__CUDA_ARCH__)
    *reinterpret_cast<Vec<T, V> *>(p) = value;
#else
    for (int j = 0; j < V; ++j) p[j] = value.v[j];
#endif
}

// ---- math, overloaded so that the double path never uses a float-only function ------
//
// On the device these are CUDA's own functions.  On the host the float versions are
// branch-free (selects, no calls), so that GCC vectorises the CPU loops; the double
// versions stay libm's (float64 is the precision reference, e.g. for gradcheck).
#if !defined(__CUDA_ARCH__)
namespace host {
// round half to even: adding 2^23 leaves no fraction bits, so the FPU rounds (in the
// default round-to-nearest-even mode, as rintf does); the sign is put back afterwards
// so that -0.3 -> -0.0.  |x| >= 2^23 (and inf, NaN) is already integral: returned as is.
PRL_HD float rint(float x) {
    const float a = fabsf(x);
    const float r = copysignf((a + 8388608.0f) - 8388608.0f, x);
    return a < 8388608.0f ? r : x;
}
PRL_HD double rint(double x) {
    const double a = fabs(x);
    const double r = copysign((a + 4503599627370496.0) - 4503599627370496.0, x);
    return a < 4503599627370496.0 ? r : x;
}
// e^x: x = n ln2 + r with |r| <= ln2/2, e^r by its Taylor series to r^7 (relative
// error < 1e-8), 2^n built in the exponent bits.  x is clamped to [-87.33, 88.72], so
// the result saturates at ~1.2e-38 and ~3.4e38 instead of reaching 0 and inf: where
// the LLTM uses it (sigmoid, tanh, the ELU and its derivative) that changes nothing
// representable.  Written as two-way selects only, so that GCC vectorises the loops.
PRL_HD float exp(float x) {
    float c = x < -87.33f ? -87.33f : x;
    c = c > 88.72f ? 88.72f : c;
    const float n = (c * 1.44269504f + 12582912.0f) - 12582912.0f;  // round to nearest integer
    const float r = (c - n * 0.693145752f) - n * 1.42860677e-6f;      // ln2 split in two for exactness
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const float e = p * bits_float((uint32_t)((int32_t)n + 127) << 23);
    return x != x ? x : e;  // NaN stays NaN
}
// e^x - 1, accurate near 0 (Taylor to x^8 for |x| < 0.5).
PRL_HD float expm1(float x) {
    float p = 1.0f / 40320.0f;
    p = p * x + 1.0f / 5040.0f;
    p = p * x + 1.0f / 720.0f;
    p = p * x + 1.0f / 120.0f;
    p = p * x + 1.0f / 24.0f;
    p = p * x + 1.0f / 6.0f;
    p = p * x + 0.5f;
    const float small = (p * x) * x + x;
    return fabsf(x) < 0.5f ? small : exp(x) - 1.0f;
}
// tanh: odd Taylor series to x^9 for |x| < 0.25, else 1 - 2 / (e^{2|x|} + 1) with the sign.
PRL_HD float tanh(float x) {
    const float a = fabsf(x), x2 = x * x;
    float p = 62.0f / 2835.0f;
    p = p * x2 - 17.0f / 315.0f;
    p = p * x2 + 2.0f / 15.0f;
    p = p * x2 - 1.0f / 3.0f;
    const float small = (p * x2) * x + x;
    const float large = copysignf(1.0f - 2.0f / (exp(2.0f * a) + 1.0f), x);
    return a < 0.25f ? small : large;
}
}  // namespace host
#endif

#if defined(__CUDA_ARCH__)
PRL_HD float rint_(float x) { return rintf(x); }
PRL_HD double rint_(double x) { return rint(x); }
PRL_HD float exp_(float x) { return expf(x); }
PRL_HD float expm1_(float x) { return expm1f(x); }
PRL_HD float tanh_(float x) { return tanhf(x); }
#else
PRL_HD float rint_(float x) { return host::rint(x); }
PRL_HD double rint_(double x) { return host::rint(x); }
PRL_HD float exp_(float x) { return host::exp(x); }
PRL_HD float expm1_(float x) { return host::expm1(x); }
PRL_HD float tanh_(float x) { return host::tanh(x); }
#endif
PRL_HD double exp_(double x) { return exp(x); }
PRL_HD double expm1_(double x) { return expm1(x); }
PRL_HD double tanh_(double x) { return tanh(x); }

// e^x where a cell stored as T is computed (in acc_t<T>).  Stored in 16 bits, the device
// uses the hardware's approximate e^x (__expf, ex2.approx: a few float ulps, ~1e-6
// relative at the gates' magnitudes, against up to 2^-8 for a bfloat16 and 2^-11 for a
// float16 rounding), and sigmoid its fast division (__fdividef: 2 ulps).  CUDA's expf and the
// IEEE division were much of the pointwise kernels' arithmetic: H100, CUDA graphs, bfloat16
// and float16 at (B, S) = (256, 1024), forward 3.46 -> 3.22 us and backward 4.46 -> 4.25 us a
// launch (benchmarks/NOTES.md).  float32, float64 and the CPU keep exp_ and the division.
template <typename T> struct stored_in_16_bits { static constexpr bool value = false; };
template <> struct stored_in_16_bits<half_t> { static constexpr bool value = true; };
template <> struct stored_in_16_bits<bfloat16_t> { static constexpr bool value = true; };

template <typename T> PRL_HD acc_t<T> cell_exp(acc_t<T> x) {
#if defined(__CUDA_ARCH__)
    if constexpr (stored_in_16_bits<T>::value) {
        return __expf(x);
    } else
#endif
    {
        return exp_(x);
    }
}

template <typename T> PRL_HD acc_t<T> sigmoid(acc_t<T> x) {
    using A = acc_t<T>;
#if defined(__CUDA_ARCH__)
    if constexpr (stored_in_16_bits<T>::value) {
        return __fdividef(1.0f, 1.0f + __expf(-x));
    } else
#endif
    {
        return A(1) / (A(1) + exp_(-x));
    }
}
template <typename A> PRL_HD A elu(A x) { return x > A(0) ? x : expm1_(x); }  // alpha = 1; accurate near 0
template <typename T> PRL_HD acc_t<T> d_elu(acc_t<T> x) {                      // d elu / dx
    return x > acc_t<T>(0) ? acc_t<T>(1) : cell_exp<T>(x);
}

}  // namespace prl
