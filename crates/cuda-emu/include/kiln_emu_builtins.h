// kiln_emu_builtins.h: CUDA's built-in device functions for kiln's CUDA emulator, as plain host
// C++17 for g++. The emulator's NVRTC compiles a kernel with g++ against these headers
// (kiln_emu_runtime.h, the execution model, includes this one; cuda_fp16.h / cuda_bf16.h too).
//
// Invariants:
// - Self-contained: needs only the C++ standard library, never kiln_emu_runtime.h. Qualifiers
//   (__device__, __host__, __forceinline__, __noinline__, __align__) get empty / `inline`
//   defaults only where the includer has not defined them.
// - Every `_rn` operation is one IEEE-754 binary32/binary64 operation rounded to nearest even,
//   never fused with a neighbour into an FMA, whatever -ffp-contract says: its operands and its
//   result pass through an empty asm the optimiser cannot see into (CUDA documents the same
//   guarantee: "will never be merged into a single multiply-add"). Plain `a * b + c` in kernel
//   code follows g++'s flags. The emulator compiles with -ffp-contract=off: results are exact
//   IEEE operation by operation and the same on every host, where a GPU (NVRTC's --fmad=true
//   default) may fuse a*b+c into one FMA and so differ in the last bit. Kernels that must match
//   bit for bit use the `_rn` intrinsics (kiln's do), which agree with the GPU exactly. The
//   `_rz` / `_rd` / `_ru` ones are the same single operation under that rounding mode.
// - Conversions between formats (float, double, integers, and __half / __nv_bfloat16 in
//   cuda_fp16.h / cuda_bf16.h) are exact integer code (`kiln_emu::round_bits`), bit-identical to
//   the GPU's: the named rounding mode, overflow to inf (or the largest finite value when the
//   mode rounds toward zero), subnormals kept, NaN to the GPU's canonical NaN; float-to-integer
//   conversions saturate and send NaN to 0, as PTX's cvt does.
// - NaN payloads of arithmetic are the host's (x86 propagates an operand's payload; a GPU returns
//   the canonical 0x7fffffff from fp32 operations). Only conversions are made canonical.
// - Math functions (expf, tanhf, erff, ...) are the host C library's. CUDA's have their own,
//   documented ULP bounds, so results may differ from a GPU's in the last bits; the fast
//   intrinsics (__expf, __fdividef, ...) are the accurate functions here.
// - Atomics (kiln_emu_atomics.h) are real, on GCC's __atomic builtins, relaxed like CUDA's: blocks
//   run concurrently on several OS threads.
// Host assumptions: 64-bit, SSE floating point (FLT_EVAL_METHOD 0), default rounding mode and
// no -ffast-math; recommended g++ flags: -std=c++17 -ffp-contract=off -fno-strict-aliasing.
#ifndef KILN_EMU_BUILTINS_H
#define KILN_EMU_BUILTINS_H

#include <cfenv>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <math.h>

#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "kiln_emu_builtins.h needs float math without excess precision (FLT_EVAL_METHOD 0, e.g. SSE)"
#endif
#if defined(__FAST_MATH__)
#error "kiln_emu_builtins.h must not be compiled with -ffast-math (IEEE results are its point)"
#endif
static_assert(sizeof(long) == 8 && sizeof(void*) == 8, "kiln_emu_builtins.h assumes LP64");

#ifndef __device__
#define __device__
#endif
#ifndef __host__
#define __host__
#endif
#ifndef __forceinline__
#define __forceinline__ inline __attribute__((always_inline))
#endif
#ifndef __noinline__
#define __noinline__ __attribute__((noinline))
#endif
#ifndef __align__
#define __align__(n) __attribute__((aligned(n)))
#endif

// Hides a value from the optimiser, so an operation feeding or consuming it is never fused.
#if defined(__x86_64__)
#define KILN_EMU_OPAQUE(v) __asm__("" : "+x"(v))
#elif defined(__aarch64__)
#define KILN_EMU_OPAQUE(v) __asm__("" : "+w"(v))
#else
#define KILN_EMU_OPAQUE(v) __asm__("" : "+m"(v))
#endif

namespace kiln_emu {

template <typename To, typename From> inline To bits_as(const From& from) {
    static_assert(sizeof(To) == sizeof(From), "bits_as: sizes differ");
    To to;
    std::memcpy(&to, &from, sizeof(To));
    return to;
}

// The four IEEE rounding directions of CUDA's _rn / _rz / _rd / _ru suffixes.
enum class Round { Nearest, Zero, Down, Up };

// A binary floating-point format: `mant` stored mantissa bits, `exp` exponent bits.
struct Format {
    int mant;
    int exp;
};
constexpr Format F16{10, 5};
constexpr Format BF16{7, 8};
constexpr Format F32{23, 8};
constexpr Format F64{52, 11};

// The GPU's canonical NaN of a format: sign clear, exponent and mantissa all ones (0x7fff for
// __half and __nv_bfloat16, 0x7fffffff for float).
constexpr uint64_t canonical_nan(Format f) {
    return (uint64_t(1) << (f.mant + f.exp)) - 1;
}

// The encoding in format `f` of (-1)^neg * m * 2^e rounded in direction `mode`: exact integer
// arithmetic, so every conversion rounds once, as the GPU's cvt does.
inline uint64_t round_bits(bool neg, uint64_t m, int e, Format f, Round mode) {
    const uint64_t sign = uint64_t(neg) << (f.mant + f.exp);
    if (m == 0) return sign;
    const int bias = (1 << (f.exp - 1)) - 1;
    const int top = 63 - __builtin_clzll(m);  // m * 2^e lies in [2^(top+e), 2^(top+e+1))
    const int exponent = top + e > 1 - bias ? top + e : 1 - bias;  // subnormals share emin
    int shift = exponent - f.mant - e;  // q = m / 2^shift has the implicit bit at f.mant
    const unsigned __int128 wide = m, one = 1;
    unsigned __int128 q, rem = 0, halfway = 0;
    if (shift <= 0) {
        q = wide << -shift;  // exact: m has fewer bits than the format
    } else {
        if (shift > 100) shift = 100;  // m < 2^64: still all below the halfway point
        q = wide >> shift;
        rem = wide & ((one << shift) - 1);
        halfway = one << (shift - 1);
    }
    bool up = false;
    if (rem != 0) {
        switch (mode) {
        case Round::Nearest: up = rem > halfway || (rem == halfway && (q & 1)); break;
        case Round::Zero: up = false; break;
        case Round::Down: up = neg; break;
        case Round::Up: up = !neg; break;
        }
    }
    q += up;
    // Normal: ((exponent + bias) << mant) + q - 2^mant; subnormal (exponent == 1 - bias): q.
    // A carry out of the mantissa moves to the next exponent by itself.
    const unsigned __int128 enc = ((unsigned __int128)(exponent + bias - 1) << f.mant) + q;
    const uint64_t inf = ((uint64_t(1) << f.exp) - 1) << f.mant;
    if (enc >= inf) {
        const bool to_inf = mode == Round::Nearest || (mode == Round::Up && !neg) ||
                            (mode == Round::Down && neg);
        return sign | (to_inf ? inf : inf - 1);
    }
    return sign | (uint64_t)enc;
}

// A double in format `f`, rounded in direction `mode`; NaN becomes the canonical NaN.
inline uint64_t double_bits_to(double d, Format f, Round mode) {
    const uint64_t x = bits_as<uint64_t>(d);
    const bool neg = x >> 63;
    const uint64_t exp = (x >> 52) & 0x7ff, mant = x & 0xfffffffffffffULL;
    if (exp == 0x7ff) {
        if (mant != 0) return canonical_nan(f);
        return (uint64_t(neg) << (f.mant + f.exp)) | (((uint64_t(1) << f.exp) - 1) << f.mant);
    }
    if (exp == 0) return round_bits(neg, mant, -1074, f, mode);
    return round_bits(neg, mant | (uint64_t(1) << 52), int(exp) - 1075, f, mode);
}

inline float double_to_float(double d, Round mode) {
    return bits_as<float>((uint32_t)double_bits_to(d, F32, mode));
}
inline double u64_to_double(bool neg, uint64_t m, Round mode) {
    return bits_as<double>(round_bits(neg, m, 0, F64, mode));
}
inline float u64_to_float(bool neg, uint64_t m, Round mode) {
    return bits_as<float>((uint32_t)round_bits(neg, m, 0, F32, mode));
}
// Sign and magnitude of an integer of any type (no signed overflow for the most negative one).
template <typename I> constexpr bool negative(I v) {
    if constexpr (std::numeric_limits<I>::is_signed) return v < 0;
    return false;
}
template <typename I> constexpr uint64_t magnitude(I v) {
    return negative(v) ? 0 - (uint64_t)v : (uint64_t)v;
}

// `v` rounded to an integer value in direction `mode` (exact in double).
inline double round_integral(double v, Round mode) {
    switch (mode) {
    case Round::Nearest: return std::nearbyint(v);
    case Round::Zero: return std::trunc(v);
    case Round::Down: return std::floor(v);
    case Round::Up: return std::ceil(v);
    }
    return v;
}

// PTX cvt to an integer type: round, then saturate to the type's range; NaN gives 0.
template <typename I> inline I to_integer(double v, Round mode) {
    using limits = std::numeric_limits<I>;
    if (v != v) return 0;
    const double r = round_integral(v, mode);
    constexpr double above = (double)(limits::max() / 2 + 1) * 2.0;  // 2^digits, exact
    if (r >= above) return limits::max();
    if (limits::is_signed ? r < -above : r < 0.0) return limits::min();
    return I(r);
}

}  // namespace kiln_emu

// ---- Bit reinterpretation ----
__device__ __forceinline__ int __float_as_int(float x) { return kiln_emu::bits_as<int>(x); }
__device__ __forceinline__ unsigned int __float_as_uint(float x) {
    return kiln_emu::bits_as<unsigned int>(x);
}
__device__ __forceinline__ float __int_as_float(int x) { return kiln_emu::bits_as<float>(x); }
__device__ __forceinline__ float __uint_as_float(unsigned int x) {
    return kiln_emu::bits_as<float>(x);
}
__device__ __forceinline__ long long __double_as_longlong(double x) {
    return kiln_emu::bits_as<long long>(x);
}
__device__ __forceinline__ double __longlong_as_double(long long x) {
    return kiln_emu::bits_as<double>(x);
}
__device__ __forceinline__ int __double2hiint(double x) {
    return (int)(kiln_emu::bits_as<unsigned long long>(x) >> 32);
}
__device__ __forceinline__ int __double2loint(double x) {
    return (int)(unsigned)kiln_emu::bits_as<unsigned long long>(x);
}
__device__ __forceinline__ double __hiloint2double(int hi, int lo) {
    return kiln_emu::bits_as<double>(((unsigned long long)(unsigned)hi << 32) | (unsigned)lo);
}

// ---- IEEE-rounded arithmetic, never contracted ----
#define KILN_EMU_RN_BINARY(NAME, T, OP)                  \
    __device__ __forceinline__ T NAME(T a, T b) {        \
        KILN_EMU_OPAQUE(a);                              \
        KILN_EMU_OPAQUE(b);                              \
        T r = a OP b;                                    \
        KILN_EMU_OPAQUE(r);                              \
        return r;                                        \
    }
KILN_EMU_RN_BINARY(__fadd_rn, float, +)
KILN_EMU_RN_BINARY(__fsub_rn, float, -)
KILN_EMU_RN_BINARY(__fmul_rn, float, *)
KILN_EMU_RN_BINARY(__fdiv_rn, float, /)
KILN_EMU_RN_BINARY(__dadd_rn, double, +)
KILN_EMU_RN_BINARY(__dsub_rn, double, -)
KILN_EMU_RN_BINARY(__dmul_rn, double, *)
KILN_EMU_RN_BINARY(__ddiv_rn, double, /)
#undef KILN_EMU_RN_BINARY
__device__ __forceinline__ float __frcp_rn(float x) { return __fdiv_rn(1.0f, x); }
__device__ __forceinline__ double __drcp_rn(double x) { return __ddiv_rn(1.0, x); }
__device__ __forceinline__ float __fsqrt_rn(float x) { return std::sqrt(x); }
__device__ __forceinline__ double __dsqrt_rn(double x) { return std::sqrt(x); }
__device__ __forceinline__ float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
__device__ __forceinline__ double __fma_rn(double a, double b, double c) {
    return std::fma(a, b, c);
}
// 1/sqrt(x): the double quotient of the correctly rounded double root, rounded to float (the
// GPU's __frsqrt_rn is correctly rounded; this agrees but for rare ties).
__device__ __forceinline__ float __frsqrt_rn(float x) {
    return (float)(1.0 / std::sqrt((double)x));
}

// ---- Directed rounding (_rz, _rd, _ru): one IEEE operation under the host's rounding mode ----
// set for it alone; operands and result cross volatile asm with a memory clobber, so g++ can
// neither fold the operation nor move it out of the fesetround window.
#define KILN_EMU_PIN(v) __asm__ volatile("" : "+m"(v) : : "memory")
#define KILN_EMU_PIN_AB KILN_EMU_PIN(a); KILN_EMU_PIN(b)
#define KILN_EMU_PIN_ABC KILN_EMU_PIN_AB; KILN_EMU_PIN(c)
#define KILN_EMU_DIRECTED_OP(NAME, T, FE, PARAMS, PINS, EXPR)                                 \
    __device__ __forceinline__ T NAME PARAMS {                                                \
        const int saved = std::fegetround();                                                  \
        std::fesetround(FE);                                                                  \
        PINS;                                                                                 \
        T r = EXPR;                                                                           \
        KILN_EMU_PIN(r);                                                                      \
        std::fesetround(saved);                                                               \
        return r;                                                                             \
    }
#define KILN_EMU_DIRECTED_TYPE(P, T, SQRT, SUF, FE)                                           \
    KILN_EMU_DIRECTED_OP(P##add_##SUF, T, FE, (T a, T b), KILN_EMU_PIN_AB, a + b) \
    KILN_EMU_DIRECTED_OP(P##sub_##SUF, T, FE, (T a, T b), KILN_EMU_PIN_AB, a - b) \
    KILN_EMU_DIRECTED_OP(P##mul_##SUF, T, FE, (T a, T b), KILN_EMU_PIN_AB, a * b) \
    KILN_EMU_DIRECTED_OP(P##div_##SUF, T, FE, (T a, T b), KILN_EMU_PIN_AB, a / b) \
    KILN_EMU_DIRECTED_OP(P##rcp_##SUF, T, FE, (T a), KILN_EMU_PIN(a), T(1) / a)              \
    KILN_EMU_DIRECTED_OP(SQRT##_##SUF, T, FE, (T a), KILN_EMU_PIN(a), std::sqrt(a))
#define KILN_EMU_DIRECTED(SUF, FE)                                                            \
    KILN_EMU_DIRECTED_TYPE(__f, float, __fsqrt, SUF, FE)                                      \
    KILN_EMU_DIRECTED_TYPE(__d, double, __dsqrt, SUF, FE)                                     \
    KILN_EMU_DIRECTED_OP(__fmaf_##SUF, float, FE, (float a, float b, float c),                \
                         KILN_EMU_PIN_ABC, std::fma(a, b, c)) \
    KILN_EMU_DIRECTED_OP(__fma_##SUF, double, FE, (double a, double b, double c),             \
                         KILN_EMU_PIN_ABC, std::fma(a, b, c))
KILN_EMU_DIRECTED(rz, FE_TOWARDZERO)
KILN_EMU_DIRECTED(rd, FE_DOWNWARD)
KILN_EMU_DIRECTED(ru, FE_UPWARD)
#undef KILN_EMU_DIRECTED
#undef KILN_EMU_DIRECTED_TYPE
#undef KILN_EMU_DIRECTED_OP
#undef KILN_EMU_PIN_ABC
#undef KILN_EMU_PIN_AB
#undef KILN_EMU_PIN

// ---- Fast single-precision intrinsics: the accurate functions here ----
// glibc declares its own __expf etc. (C linkage), so CUDA's names are macros for these.
namespace kiln_emu {
inline float fast_exp(float x) { return expf(x); }
inline float fast_exp10(float x) { return exp10f(x); }
inline float fast_log(float x) { return logf(x); }
inline float fast_log2(float x) { return log2f(x); }
inline float fast_log10(float x) { return log10f(x); }
inline float fast_sin(float x) { return sinf(x); }
inline float fast_cos(float x) { return cosf(x); }
inline float fast_tan(float x) { return tanf(x); }
inline float fast_pow(float x, float y) { return powf(x, y); }
inline void fast_sincos(float x, float* s, float* c) {
    *s = sinf(x);
    *c = cosf(x);
}
}  // namespace kiln_emu
#define __expf kiln_emu::fast_exp
#define __exp10f kiln_emu::fast_exp10
#define __logf kiln_emu::fast_log
#define __log2f kiln_emu::fast_log2
#define __log10f kiln_emu::fast_log10
#define __sinf kiln_emu::fast_sin
#define __cosf kiln_emu::fast_cos
#define __tanf kiln_emu::fast_tan
#define __powf kiln_emu::fast_pow
#define __sincosf kiln_emu::fast_sincos
__device__ __forceinline__ float __fdividef(float a, float b) { return a / b; }
__device__ __forceinline__ float fdividef(float a, float b) { return a / b; }
// Clamps to [0, 1]; NaN gives 0.
__device__ __forceinline__ float __saturatef(float x) {
    return x >= 1.0f ? 1.0f : (x > 0.0f ? x : 0.0f);
}

// ---- CUDA math functions the C library lacks ----
__device__ __forceinline__ float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
__device__ __forceinline__ double rsqrt(double x) { return 1.0 / std::sqrt(x); }
__device__ __forceinline__ float rcbrtf(float x) { return 1.0f / std::cbrt(x); }
__device__ __forceinline__ double rcbrt(double x) { return 1.0 / std::cbrt(x); }
// sin(pi x) / cos(pi x) with the argument reduced exactly first, so integers and halves are exact.
__device__ __forceinline__ double sinpi(double x) {
    const double r = std::remainder(x, 2.0);  // exact, in [-1, 1]
    if (r == std::trunc(r)) return std::copysign(0.0, x);
    return std::sin(3.141592653589793 * r);
}
__device__ __forceinline__ double cospi(double x) {
    const double r = std::fabs(std::remainder(x, 2.0));
    if (r == 0.5) return 0.0;
    return std::cos(3.141592653589793 * r);
}
__device__ __forceinline__ float sinpif(float x) { return (float)sinpi(x); }
__device__ __forceinline__ float cospif(float x) { return (float)cospi(x); }
__device__ __forceinline__ void sincospi(double x, double* s, double* c) {
    *s = sinpi(x);
    *c = cospi(x);
}
__device__ __forceinline__ void sincospif(float x, float* s, float* c) {
    *s = sinpif(x);
    *c = cospif(x);
}
__device__ __forceinline__ double normcdf(double x) { return 0.5 * std::erfc(-x * 0.7071067811865476); }
__device__ __forceinline__ float normcdff(float x) { return (float)normcdf(x); }

// Inverse error functions: Winitzki's closed form as the start, then Newton steps on erf (for
// |x| < 1/2) or erfc (the tails, where 1 - |x| is exact), to about double precision (CUDA's
// own have a few ulp of error, so last bits may differ from a GPU's).
namespace kiln_emu {
// The closed-form start for erfinv, from x's sign and log(1 - x^2).
inline double erfinv_start(bool neg, double log_1mx2) {
    const double a = 0.147, b = 2.0 / (3.141592653589793 * a) + log_1mx2 / 2.0;
    const double y = std::sqrt(std::sqrt(b * b - log_1mx2 / a) - b);
    return neg ? -y : y;
}
inline double erfcinv_newton(double t) {  // t in (0, 2)
    double y = erfinv_start(t > 1.0, std::log(t * (2.0 - t)));
    // In the upper tail Newton runs on log(erfc), which is close to linear there.
    const bool tail = t < 0.5;
    for (int i = 0; i < 8; ++i) {
        const double e = std::erfc(y), slope = 1.1283791670955126 * std::exp(-y * y);
        y += tail ? (std::log(e) - std::log(t)) * e / slope : (e - t) / slope;
    }
    return y;
}
}  // namespace kiln_emu
__device__ __forceinline__ double erfcinv(double t) {
    if (!(t > 0.0 && t < 2.0)) return t == 0.0 ? INFINITY : (t == 2.0 ? -INFINITY : NAN);
    return kiln_emu::erfcinv_newton(t);
}
__device__ __forceinline__ double erfinv(double x) {
    if (!(std::fabs(x) < 0.5))
        return std::fabs(x) <= 1.0 ? std::copysign(erfcinv(1.0 - std::fabs(x)), x) : NAN;
    if (x == 0.0) return x;
    double y = kiln_emu::erfinv_start(x < 0.0, std::log1p(-x * x));
    for (int i = 0; i < 6; ++i) y -= (std::erf(y) - x) / (1.1283791670955126 * std::exp(-y * y));
    return y;
}
__device__ __forceinline__ double normcdfinv(double p) {
    const double y = erfcinv(2.0 * p);
    return y == 0.0 ? 0.0 : -1.4142135623730951 * y;
}
__device__ __forceinline__ float erfinvf(float x) { return (float)erfinv(x); }
__device__ __forceinline__ float erfcinvf(float x) { return (float)erfcinv(x); }
__device__ __forceinline__ float normcdfinvf(float x) { return (float)normcdfinv(x); }

// ---- Conversions (PTX cvt semantics, see the opening comment) ----
#define KILN_EMU_MODES(X) X(rn, Nearest) X(rz, Zero) X(rd, Down) X(ru, Up)
#define KILN_EMU_CVT(SUF, MODE)                                                               \
    __device__ __forceinline__ float __double2float_##SUF(double x) {                         \
        return kiln_emu::double_to_float(x, kiln_emu::Round::MODE);                           \
    }                                                                                         \
    __device__ __forceinline__ int __float2int_##SUF(float x) {                               \
        return kiln_emu::to_integer<int>(x, kiln_emu::Round::MODE);                           \
    }                                                                                         \
    __device__ __forceinline__ unsigned __float2uint_##SUF(float x) {                         \
        return kiln_emu::to_integer<unsigned>(x, kiln_emu::Round::MODE);                      \
    }                                                                                         \
    __device__ __forceinline__ long long __float2ll_##SUF(float x) {                          \
        return kiln_emu::to_integer<long long>(x, kiln_emu::Round::MODE);                     \
    }                                                                                         \
    __device__ __forceinline__ unsigned long long __float2ull_##SUF(float x) {                \
        return kiln_emu::to_integer<unsigned long long>(x, kiln_emu::Round::MODE);            \
    }                                                                                         \
    __device__ __forceinline__ int __double2int_##SUF(double x) {                             \
        return kiln_emu::to_integer<int>(x, kiln_emu::Round::MODE);                           \
    }                                                                                         \
    __device__ __forceinline__ unsigned __double2uint_##SUF(double x) {                       \
        return kiln_emu::to_integer<unsigned>(x, kiln_emu::Round::MODE);                      \
    }                                                                                         \
    __device__ __forceinline__ long long __double2ll_##SUF(double x) {                        \
        return kiln_emu::to_integer<long long>(x, kiln_emu::Round::MODE);                     \
    }                                                                                         \
    __device__ __forceinline__ unsigned long long __double2ull_##SUF(double x) {              \
        return kiln_emu::to_integer<unsigned long long>(x, kiln_emu::Round::MODE);            \
    }                                                                                         \
    __device__ __forceinline__ float __int2float_##SUF(int x) {                               \
        return kiln_emu::u64_to_float(x < 0, kiln_emu::magnitude(x), kiln_emu::Round::MODE);  \
    }                                                                                         \
    __device__ __forceinline__ float __uint2float_##SUF(unsigned x) {                         \
        return kiln_emu::u64_to_float(false, x, kiln_emu::Round::MODE);                       \
    }                                                                                         \
    __device__ __forceinline__ float __ll2float_##SUF(long long x) {                          \
        return kiln_emu::u64_to_float(x < 0, kiln_emu::magnitude(x), kiln_emu::Round::MODE);  \
    }                                                                                         \
    __device__ __forceinline__ float __ull2float_##SUF(unsigned long long x) {                \
        return kiln_emu::u64_to_float(false, x, kiln_emu::Round::MODE);                       \
    }                                                                                         \
    __device__ __forceinline__ double __ll2double_##SUF(long long x) {                        \
        return kiln_emu::u64_to_double(x < 0, kiln_emu::magnitude(x), kiln_emu::Round::MODE); \
    }                                                                                         \
    __device__ __forceinline__ double __ull2double_##SUF(unsigned long long x) {              \
        return kiln_emu::u64_to_double(false, x, kiln_emu::Round::MODE);                      \
    }
KILN_EMU_MODES(KILN_EMU_CVT)
#undef KILN_EMU_CVT
__device__ __forceinline__ double __int2double_rn(int x) { return (double)x; }
__device__ __forceinline__ double __uint2double_rn(unsigned x) { return (double)x; }

// ---- Integer intrinsics ----
__device__ __forceinline__ int __popc(unsigned int x) { return __builtin_popcount(x); }
__device__ __forceinline__ int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
__device__ __forceinline__ int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
__device__ __forceinline__ int __clzll(long long x) {
    return x == 0 ? 64 : __builtin_clzll((unsigned long long)x);
}
__device__ __forceinline__ int __ffs(int x) { return __builtin_ffs(x); }
__device__ __forceinline__ int __ffsll(long long x) { return __builtin_ffsll(x); }
__device__ __forceinline__ unsigned int __brev(unsigned int x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    return __builtin_bswap32(x);
}
__device__ __forceinline__ unsigned long long __brevll(unsigned long long x) {
    return ((unsigned long long)__brev((unsigned)x) << 32) | __brev((unsigned)(x >> 32));
}
__device__ __forceinline__ unsigned int __byte_perm(unsigned int x, unsigned int y,
                                                    unsigned int s) {
    const unsigned long long bytes = ((unsigned long long)y << 32) | x;
    unsigned int r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((bytes >> (((s >> (4 * i)) & 7) * 8)) & 0xff) << (8 * i);
    return r;
}
__device__ __forceinline__ unsigned int __umulhi(unsigned int a, unsigned int b) {
    return (unsigned)(((unsigned long long)a * b) >> 32);
}
__device__ __forceinline__ int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
__device__ __forceinline__ unsigned long long __umul64hi(unsigned long long a,
                                                         unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
__device__ __forceinline__ long long __mul64hi(long long a, long long b) {
    return (long long)(((__int128)a * b) >> 64);
}
__device__ __forceinline__ int __mul24(int a, int b) {
    return (int)((unsigned)(((a << 8) >> 8) * ((b << 8) >> 8)));
}
__device__ __forceinline__ unsigned int __umul24(unsigned int a, unsigned int b) {
    return (a & 0xffffffu) * (b & 0xffffffu);
}
__device__ __forceinline__ int __hadd(int a, int b) { return (int)(((long long)a + b) >> 1); }
__device__ __forceinline__ int __rhadd(int a, int b) { return (int)(((long long)a + b + 1) >> 1); }
__device__ __forceinline__ unsigned int __uhadd(unsigned int a, unsigned int b) {
    return (unsigned)(((unsigned long long)a + b) >> 1);
}
__device__ __forceinline__ unsigned int __urhadd(unsigned int a, unsigned int b) {
    return (unsigned)(((unsigned long long)a + b + 1) >> 1);
}
__device__ __forceinline__ unsigned int __sad(int x, int y, unsigned int z) {
    return z + (unsigned)(x > y ? (long long)x - y : (long long)y - x);
}
__device__ __forceinline__ unsigned int __usad(unsigned int x, unsigned int y, unsigned int z) {
    return z + (x > y ? x - y : y - x);
}
__device__ __forceinline__ unsigned int __funnelshift_l(unsigned int lo, unsigned int hi,
                                                        unsigned int shift) {
    const unsigned long long v = ((unsigned long long)hi << 32) | lo;
    return (unsigned)((v << (shift & 31)) >> 32);
}
__device__ __forceinline__ unsigned int __funnelshift_r(unsigned int lo, unsigned int hi,
                                                        unsigned int shift) {
    const unsigned long long v = ((unsigned long long)hi << 32) | lo;
    return (unsigned)(v >> (shift & 31));
}
__device__ __forceinline__ unsigned int __funnelshift_lc(unsigned int lo, unsigned int hi,
                                                         unsigned int shift) {
    return __funnelshift_l(lo, hi, shift > 32 ? 32 : shift);
}
__device__ __forceinline__ unsigned int __funnelshift_rc(unsigned int lo, unsigned int hi,
                                                         unsigned int shift) {
    const unsigned long long v = ((unsigned long long)hi << 32) | lo;
    return (unsigned)(v >> (shift > 32 ? 32 : shift));
}

// ---- min / max: CUDA's global overloads (integers exact, floating point as fminf / fmax) ----
#define KILN_EMU_MINMAX(T)                                                      \
    __device__ __forceinline__ T min(T a, T b) { return a < b ? a : b; }        \
    __device__ __forceinline__ T max(T a, T b) { return a > b ? a : b; }
KILN_EMU_MINMAX(int)
KILN_EMU_MINMAX(unsigned int)
KILN_EMU_MINMAX(long)
KILN_EMU_MINMAX(unsigned long)
KILN_EMU_MINMAX(long long)
KILN_EMU_MINMAX(unsigned long long)
#undef KILN_EMU_MINMAX
// Mixed signedness compares as the unsigned type, as CUDA's overloads do.
#define KILN_EMU_MINMAX_MIXED(S, U)                                             \
    __device__ __forceinline__ U min(S a, U b) { return min((U)a, b); }         \
    __device__ __forceinline__ U min(U a, S b) { return min(a, (U)b); }         \
    __device__ __forceinline__ U max(S a, U b) { return max((U)a, b); }         \
    __device__ __forceinline__ U max(U a, S b) { return max(a, (U)b); }
KILN_EMU_MINMAX_MIXED(int, unsigned int)
KILN_EMU_MINMAX_MIXED(long, unsigned long)
KILN_EMU_MINMAX_MIXED(long long, unsigned long long)
#undef KILN_EMU_MINMAX_MIXED
__device__ __forceinline__ float min(float a, float b) { return std::fmin(a, b); }
__device__ __forceinline__ float max(float a, float b) { return std::fmax(a, b); }
__device__ __forceinline__ double min(double a, double b) { return std::fmin(a, b); }
__device__ __forceinline__ double max(double a, double b) { return std::fmax(a, b); }
__device__ __forceinline__ double min(float a, double b) { return std::fmin((double)a, b); }
__device__ __forceinline__ double min(double a, float b) { return std::fmin(a, (double)b); }
__device__ __forceinline__ double max(float a, double b) { return std::fmax((double)a, b); }
__device__ __forceinline__ double max(double a, float b) { return std::fmax(a, (double)b); }
__device__ __forceinline__ unsigned int umin(unsigned int a, unsigned int b) { return min(a, b); }
__device__ __forceinline__ unsigned int umax(unsigned int a, unsigned int b) { return max(a, b); }
__device__ __forceinline__ long long llmin(long long a, long long b) { return min(a, b); }
__device__ __forceinline__ long long llmax(long long a, long long b) { return max(a, b); }
__device__ __forceinline__ unsigned long long ullmin(unsigned long long a, unsigned long long b) {
    return min(a, b);
}
__device__ __forceinline__ unsigned long long ullmax(unsigned long long a, unsigned long long b) {
    return max(a, b);
}

#include "kiln_emu_vector_types.h"
#include "kiln_emu_atomics.h"

#endif  // KILN_EMU_BUILTINS_H
