// kiln_emu_float16.h: what CUDA's __half and __nv_bfloat16 have in common, for kiln's CUDA
// emulator: one macro that defines a 16-bit float type, its pair type and their raw forms with
// CUDA's members, constructors, conversion operators, arithmetic and comparison intrinsics,
// operators, math functions, loads and atomics. cuda_fp16.h and cuda_bf16.h instantiate it
// (once each) and add the conversion functions that carry the type's name.
//
// Invariants: a 16-bit value is stored as its IEEE bit pattern (sizeof 2, align 2; the pair:
// sizeof 4, align 4), never as a wider float. Narrowing rounds exactly once (kiln_emu::narrow_bits
// and double_bits_to: float and double sources round directly, NaN becomes 0x7fff).
// Arithmetic is computed in float and rounded once to 16 bits, which equals the correctly
// rounded 16-bit operation for + - * / and sqrt (float has more than 2p+2 bits for p = 11 and
// 8); the fused multiply-add rounds once through round-to-odd in double. Widening is exact.
#ifndef KILN_EMU_FLOAT16_H
#define KILN_EMU_FLOAT16_H

#include "kiln_emu_builtins.h"

namespace kiln_emu {

// A 16-bit pattern of format `f` widened to float, exactly. NaN keeps its sign and payload with
// the quiet bit set (IEEE's widening); bfloat16 (8 exponent bits) is a plain shift, as CUDA's
// __bfloat162float is.
inline float widen_bits(unsigned short h, Format f) {
    if (f.exp == 8) return bits_as<float>((uint32_t)h << 16);
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    int exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0x1f)
        return bits_as<float>(sign | 0x7f800000u | (mant ? 0x400000u | (mant << 13) : 0));
    if (exp == 0) {
        if (mant == 0) return bits_as<float>(sign);
        const int shift = __builtin_clz(mant) - 21;  // moves the leading 1 to bit 10
        mant = (mant << shift) & 0x3ff;
        exp = 1 - shift;
    }
    return bits_as<float>(sign | (uint32_t)(exp + 112) << 23 | mant << 13);
}

// Rounds x once to format `f`, to nearest even (the general path, any source).
inline unsigned short narrow_bits(double x, Format f) {
    return (unsigned short)double_bits_to(x, f, Round::Nearest);
}

// The same from a float, on 32-bit integer code only (the kernels' hot path); the tests check it
// against the general path's results over every class of input.
inline unsigned short narrow_bits(float x, Format f) {
    const uint32_t b = bits_as<uint32_t>(x), a = b & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7fff;
    if (f.exp == 8) return (unsigned short)((b + 0x7fffu + ((b >> 16) & 1)) >> 16);
    const uint32_t sign = (b >> 16) & 0x8000u;
    if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // >= 65520: inf
    if (a >= 0x38800000u) {                                          // a normal half
        const uint32_t r = a - 0x38000000u;                          // exponent rebiased
        return (unsigned short)(sign | (r + 0xfffu + ((r >> 13) & 1)) >> 13);
    }
    if (a <= 0x33000000u) return (unsigned short)sign;  // at most 2^-25: ties to even zero
    const uint32_t shift = 126 - (a >> 23), m = (a & 0x7fffffu) | 0x800000u;
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    q += rem > halfway || (rem == halfway && (q & 1));
    return (unsigned short)(sign | q);
}

// a * b + c rounded once to format `f`: the product is exact in double, the sum is rounded to
// odd in double (TwoSum gives its error), and that 53-bit result rounds correctly to 16 bits.
inline unsigned short fma_bits(float a, float b, float c, Format f) {
    const double p = (double)a * (double)b, q = c;
    double s = p + q;
    if (std::isfinite(s)) {
        const double pv = s - q, qv = s - pv;
        const double err = (p - pv) + (q - qv);
        uint64_t bits = bits_as<uint64_t>(s);
        if (err != 0 && !(bits & 1)) {
            // s is even: the odd neighbour on err's side is the round-to-odd result.
            bits += ((err > 0) == (s > 0)) ? 1 : -1;
            s = bits_as<double>(bits);
        }
    }
    return narrow_bits(s, f);
}

}  // namespace kiln_emu

// T: the type (__half); T2: its pair; RAW, RAW2: their raw forms; FMT: its kiln_emu::Format.
#define KILN_EMU_FLOAT16(T, T2, RAW, RAW2, FMT)                                                \
    struct __attribute__((aligned(2))) RAW { unsigned short x; };                              \
    struct __attribute__((aligned(4))) RAW2 { unsigned short x, y; };                          \
    struct __attribute__((aligned(2))) T {                                                     \
      protected:                                                                               \
        unsigned short __x;                                                                    \
        void kiln_set(float v) { __x = kiln_emu::narrow_bits(v, FMT); }                        \
        void kiln_set(double v) { __x = kiln_emu::narrow_bits(v, FMT); }                       \
        void kiln_set_int(bool neg, unsigned long long m) {                                    \
            __x = (unsigned short)kiln_emu::round_bits(neg, m, 0, FMT, kiln_emu::Round::Nearest); \
        }                                                                                      \
                                                                                               \
      public:                                                                                  \
        T() = default;                                                                         \
        constexpr T(const RAW& r) : __x(r.x) {}                                                \
        T& operator=(const RAW& r) { __x = r.x; return *this; }                                \
        volatile T& operator=(const RAW& r) volatile { __x = r.x; return *this; }              \
        constexpr operator RAW() const { return RAW{__x}; }                                    \
        operator RAW() const volatile { return RAW{__x}; }                                     \
        T(float v) { kiln_set(v); }                                                            \
        T(double v) { kiln_set(v); }                                                           \
        T& operator=(float v) { kiln_set(v); return *this; }                                   \
        T& operator=(double v) { kiln_set(v); return *this; }                                  \
        operator float() const { return kiln_emu::widen_bits(__x, FMT); }                      \
        T(short v) { kiln_set_int(v < 0, kiln_emu::magnitude(v)); }                            \
        T(int v) { kiln_set_int(v < 0, kiln_emu::magnitude(v)); }                              \
        T(long v) { kiln_set_int(v < 0, kiln_emu::magnitude(v)); }                             \
        T(long long v) { kiln_set_int(v < 0, kiln_emu::magnitude(v)); }                        \
        T(unsigned short v) { kiln_set_int(false, v); }                                        \
        T(unsigned int v) { kiln_set_int(false, v); }                                          \
        T(unsigned long v) { kiln_set_int(false, v); }                                         \
        T(unsigned long long v) { kiln_set_int(false, v); }                                    \
        T& operator=(short v) { return *this = T(v); }                                         \
        T& operator=(int v) { return *this = T(v); }                                           \
        T& operator=(long long v) { return *this = T(v); }                                     \
        T& operator=(unsigned short v) { return *this = T(v); }                                \
        T& operator=(unsigned int v) { return *this = T(v); }                                  \
        T& operator=(unsigned long long v) { return *this = T(v); }                            \
        operator short() const { return kiln_emu::to_integer<short>(float(*this), kiln_emu::Round::Zero); } \
        operator unsigned short() const {                                                      \
            return kiln_emu::to_integer<unsigned short>(float(*this), kiln_emu::Round::Zero);  \
        }                                                                                      \
        operator int() const { return kiln_emu::to_integer<int>(float(*this), kiln_emu::Round::Zero); } \
        operator unsigned int() const {                                                        \
            return kiln_emu::to_integer<unsigned int>(float(*this), kiln_emu::Round::Zero);    \
        }                                                                                      \
        operator long long() const {                                                           \
            return kiln_emu::to_integer<long long>(float(*this), kiln_emu::Round::Zero);       \
        }                                                                                      \
        operator unsigned long long() const {                                                  \
            return kiln_emu::to_integer<unsigned long long>(float(*this), kiln_emu::Round::Zero); \
        }                                                                                      \
        operator bool() const { return (__x & 0x7fff) != 0; }                         \
    };                                                                                         \
    struct __attribute__((aligned(4))) T2 {                                                    \
        T x, y;                                                                                \
        T2() = default;                                                                        \
        constexpr T2(const T& a, const T& b) : x(a), y(b) {}                                   \
        constexpr T2(const RAW2& r) : x(RAW{r.x}), y(RAW{r.y}) {}                              \
        T2& operator=(const RAW2& r) { x = RAW{r.x}; y = RAW{r.y}; return *this; }             \
        operator RAW2() const { return RAW2{RAW(x).x, RAW(y).x}; }                             \
    };                                                                                         \
    static_assert(sizeof(T) == 2 && alignof(T) == 2 && sizeof(T2) == 4 && alignof(T2) == 4,    \
                  #T " layout differs from CUDA's");                                           \
    KILN_EMU_FLOAT16_OPS(T, T2, RAW, FMT)

// The arithmetic of T and T2 (see KILN_EMU_FLOAT16).
#define KILN_EMU_FLOAT16_OPS(T, T2, RAW, FMT)                                                  \
    __device__ __forceinline__ T kiln_emu_round(T, float v) { return RAW{kiln_emu::narrow_bits(v, FMT)}; } \
    __device__ __forceinline__ T __hadd(T a, T b) { return kiln_emu_round(a, __fadd_rn(a, b)); } \
    __device__ __forceinline__ T __hsub(T a, T b) { return kiln_emu_round(a, __fsub_rn(a, b)); } \
    __device__ __forceinline__ T __hmul(T a, T b) { return kiln_emu_round(a, __fmul_rn(a, b)); } \
    __device__ __forceinline__ T __hdiv(T a, T b) { return kiln_emu_round(a, __fdiv_rn(a, b)); } \
    __device__ __forceinline__ T __hfma(T a, T b, T c) {                                       \
        return RAW{kiln_emu::fma_bits(a, b, c, FMT)};                                          \
    }                                                                                          \
    __device__ __forceinline__ T __hneg(T a) { return RAW{(unsigned short)(RAW(a).x ^ 0x8000)}; } \
    __device__ __forceinline__ T __habs(T a) { return RAW{(unsigned short)(RAW(a).x & 0x7fff)}; } \
    __device__ __forceinline__ T __hadd_sat(T a, T b) { return kiln_emu_round(a, __saturatef(__hadd(a, b))); } \
    __device__ __forceinline__ T __hsub_sat(T a, T b) { return kiln_emu_round(a, __saturatef(__hsub(a, b))); } \
    __device__ __forceinline__ T __hmul_sat(T a, T b) { return kiln_emu_round(a, __saturatef(__hmul(a, b))); } \
    __device__ __forceinline__ bool __hisnan(T a) {                                            \
        return (RAW(a).x & 0x7fffu) > (((1u << FMT.exp) - 1) << FMT.mant);                     \
    }                                                                                          \
    __device__ __forceinline__ int __hisinf(T a) {                                             \
        const float f = a;                                                                     \
        return std::isinf(f) ? (f > 0 ? 1 : -1) : 0;                                           \
    }                                                                                          \
    __device__ __forceinline__ bool __heq(T a, T b) { return float(a) == float(b); }           \
    __device__ __forceinline__ bool __hne(T a, T b) { return float(a) < float(b) || float(a) > float(b); } \
    __device__ __forceinline__ bool __hlt(T a, T b) { return float(a) < float(b); }            \
    __device__ __forceinline__ bool __hle(T a, T b) { return float(a) <= float(b); }           \
    __device__ __forceinline__ bool __hgt(T a, T b) { return float(a) > float(b); }            \
    __device__ __forceinline__ bool __hge(T a, T b) { return float(a) >= float(b); }           \
    __device__ __forceinline__ bool __hequ(T a, T b) { return !__hne(a, b); }                  \
    __device__ __forceinline__ bool __hneu(T a, T b) { return !__heq(a, b); }                  \
    __device__ __forceinline__ bool __hltu(T a, T b) { return !__hge(a, b); }                  \
    __device__ __forceinline__ bool __hleu(T a, T b) { return !__hgt(a, b); }                  \
    __device__ __forceinline__ bool __hgtu(T a, T b) { return !__hle(a, b); }                  \
    __device__ __forceinline__ bool __hgeu(T a, T b) { return !__hlt(a, b); }                  \
    /* min / max: a NaN operand yields the other one (both NaN: canonical NaN), +0 > -0; the */ \
    /* _nan variants yield the canonical NaN when either operand is NaN. */                    \
    __device__ __forceinline__ T __hmax(T a, T b) {                                            \
        if (__hisnan(a)) return __hisnan(b) ? T(RAW{0x7fff}) : b;                              \
        if (__hisnan(b)) return a;                                                             \
        const float fa = a, fb = b;                                                            \
        if (fa == fb) return std::signbit(fa) ? b : a;                                         \
        return fa > fb ? a : b;                                                                \
    }                                                                                          \
    __device__ __forceinline__ T __hmin(T a, T b) {                                            \
        if (__hisnan(a)) return __hisnan(b) ? T(RAW{0x7fff}) : b;                              \
        if (__hisnan(b)) return a;                                                             \
        const float fa = a, fb = b;                                                            \
        if (fa == fb) return std::signbit(fa) ? a : b;                                         \
        return fa < fb ? a : b;                                                                \
    }                                                                                          \
    __device__ __forceinline__ T __hmax_nan(T a, T b) {                                        \
        return __hisnan(a) || __hisnan(b) ? T(RAW{0x7fff}) : __hmax(a, b);                     \
    }                                                                                          \
    __device__ __forceinline__ T __hmin_nan(T a, T b) {                                        \
        return __hisnan(a) || __hisnan(b) ? T(RAW{0x7fff}) : __hmin(a, b);                     \
    }                                                                                          \
    __device__ __forceinline__ T operator+(const T& a, const T& b) { return __hadd(a, b); }    \
    __device__ __forceinline__ T operator-(const T& a, const T& b) { return __hsub(a, b); }    \
    __device__ __forceinline__ T operator*(const T& a, const T& b) { return __hmul(a, b); }    \
    __device__ __forceinline__ T operator/(const T& a, const T& b) { return __hdiv(a, b); }    \
    __device__ __forceinline__ T& operator+=(T& a, const T& b) { return a = __hadd(a, b); }    \
    __device__ __forceinline__ T& operator-=(T& a, const T& b) { return a = __hsub(a, b); }    \
    __device__ __forceinline__ T& operator*=(T& a, const T& b) { return a = __hmul(a, b); }    \
    __device__ __forceinline__ T& operator/=(T& a, const T& b) { return a = __hdiv(a, b); }    \
    __device__ __forceinline__ T& operator++(T& a) { return a = __hadd(a, T(1.0f)); }          \
    __device__ __forceinline__ T& operator--(T& a) { return a = __hsub(a, T(1.0f)); }          \
    __device__ __forceinline__ T operator++(T& a, int) { const T r = a; ++a; return r; }       \
    __device__ __forceinline__ T operator--(T& a, int) { const T r = a; --a; return r; }       \
    __device__ __forceinline__ T operator+(const T& a) { return a; }                           \
    __device__ __forceinline__ T operator-(const T& a) { return __hneg(a); }                   \
    __device__ __forceinline__ bool operator==(const T& a, const T& b) { return __heq(a, b); } \
    __device__ __forceinline__ bool operator!=(const T& a, const T& b) { return __hneu(a, b); } \
    __device__ __forceinline__ bool operator<(const T& a, const T& b) { return __hlt(a, b); }  \
    __device__ __forceinline__ bool operator<=(const T& a, const T& b) { return __hle(a, b); } \
    __device__ __forceinline__ bool operator>(const T& a, const T& b) { return __hgt(a, b); }  \
    __device__ __forceinline__ bool operator>=(const T& a, const T& b) { return __hge(a, b); } \
    /* Math functions: the float function's result rounded to 16 bits. */                      \
    __device__ __forceinline__ T hsqrt(T a) { return kiln_emu_round(a, std::sqrt(float(a))); } \
    __device__ __forceinline__ T hrsqrt(T a) { return kiln_emu_round(a, 1.0f / std::sqrt(float(a))); } \
    __device__ __forceinline__ T hrcp(T a) { return kiln_emu_round(a, 1.0f / float(a)); }      \
    __device__ __forceinline__ T hexp(T a) { return kiln_emu_round(a, std::exp(float(a))); }   \
    __device__ __forceinline__ T hexp2(T a) { return kiln_emu_round(a, std::exp2(float(a))); } \
    __device__ __forceinline__ T hexp10(T a) { return kiln_emu_round(a, exp10f(float(a))); }   \
    __device__ __forceinline__ T hlog(T a) { return kiln_emu_round(a, std::log(float(a))); }   \
    __device__ __forceinline__ T hlog2(T a) { return kiln_emu_round(a, std::log2(float(a))); } \
    __device__ __forceinline__ T hlog10(T a) { return kiln_emu_round(a, std::log10(float(a))); } \
    __device__ __forceinline__ T hsin(T a) { return kiln_emu_round(a, std::sin(float(a))); }   \
    __device__ __forceinline__ T hcos(T a) { return kiln_emu_round(a, std::cos(float(a))); }   \
    __device__ __forceinline__ T htanh(T a) { return kiln_emu_round(a, std::tanh(float(a))); } \
    __device__ __forceinline__ T hfloor(T a) { return kiln_emu_round(a, std::floor(float(a))); } \
    __device__ __forceinline__ T hceil(T a) { return kiln_emu_round(a, std::ceil(float(a))); } \
    __device__ __forceinline__ T htrunc(T a) { return kiln_emu_round(a, std::trunc(float(a))); } \
    __device__ __forceinline__ T hrint(T a) { return kiln_emu_round(a, std::nearbyint(float(a))); } \
    /* Pairs: each half independently. */                                                     \
    __device__ __forceinline__ T2 __hadd2(T2 a, T2 b) { return T2(__hadd(a.x, b.x), __hadd(a.y, b.y)); } \
    __device__ __forceinline__ T2 __hsub2(T2 a, T2 b) { return T2(__hsub(a.x, b.x), __hsub(a.y, b.y)); } \
    __device__ __forceinline__ T2 __hmul2(T2 a, T2 b) { return T2(__hmul(a.x, b.x), __hmul(a.y, b.y)); } \
    __device__ __forceinline__ T2 __h2div(T2 a, T2 b) { return T2(__hdiv(a.x, b.x), __hdiv(a.y, b.y)); } \
    __device__ __forceinline__ T2 __hfma2(T2 a, T2 b, T2 c) {                                  \
        return T2(__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y));                               \
    }                                                                                          \
    __device__ __forceinline__ T2 __hneg2(T2 a) { return T2(__hneg(a.x), __hneg(a.y)); }       \
    __device__ __forceinline__ T2 __habs2(T2 a) { return T2(__habs(a.x), __habs(a.y)); }       \
    __device__ __forceinline__ T2 __hmax2(T2 a, T2 b) { return T2(__hmax(a.x, b.x), __hmax(a.y, b.y)); } \
    __device__ __forceinline__ T2 __hmin2(T2 a, T2 b) { return T2(__hmin(a.x, b.x), __hmin(a.y, b.y)); } \
    __device__ __forceinline__ T2 operator+(const T2& a, const T2& b) { return __hadd2(a, b); } \
    __device__ __forceinline__ T2 operator-(const T2& a, const T2& b) { return __hsub2(a, b); } \
    __device__ __forceinline__ T2 operator*(const T2& a, const T2& b) { return __hmul2(a, b); } \
    __device__ __forceinline__ T2 operator/(const T2& a, const T2& b) { return __h2div(a, b); } \
    __device__ __forceinline__ T2& operator+=(T2& a, const T2& b) { return a = __hadd2(a, b); } \
    __device__ __forceinline__ T2& operator-=(T2& a, const T2& b) { return a = __hsub2(a, b); } \
    __device__ __forceinline__ T2& operator*=(T2& a, const T2& b) { return a = __hmul2(a, b); } \
    __device__ __forceinline__ T2& operator/=(T2& a, const T2& b) { return a = __h2div(a, b); } \
    __device__ __forceinline__ T2 operator-(const T2& a) { return __hneg2(a); }                \
    __device__ __forceinline__ bool operator==(const T2& a, const T2& b) { return a.x == b.x && a.y == b.y; } \
    __device__ __forceinline__ bool operator!=(const T2& a, const T2& b) { return a.x != b.x && a.y != b.y; } \
    __device__ __forceinline__ float __low2float(T2 a) { return a.x; }                         \
    __device__ __forceinline__ float __high2float(T2 a) { return a.y; }                        \
    KILN_EMU_LOADS(T)                                                                          \
    KILN_EMU_LOADS(T2)                                                                         \
    /* atom.add.noftz: the sum rounded once, subnormals kept. */                               \
    __device__ __forceinline__ T atomicAdd(T* address, T val) {                                \
        return kiln_emu::atomic_update(address, [val](T old) { return __hadd(old, val); });    \
    }                                                                                          \
    __device__ __forceinline__ T2 atomicAdd(T2* address, T2 val) {                             \
        return kiln_emu::atomic_update(address, [val](T2 old) { return __hadd2(old, val); });  \
    }

// The conversion functions whose names carry the type's name N (half, bfloat16).
#define KILN_EMU_FLOAT16_NAMED(T, T2, RAW, FMT, N)                                              \
    __device__ __forceinline__ T __float2##N(float v) { return RAW{kiln_emu::narrow_bits(v, FMT)}; } \
    __device__ __forceinline__ T __double2##N(double v) { return RAW{kiln_emu::narrow_bits(v, FMT)}; } \
    __device__ __forceinline__ float __##N##2float(T h) { return kiln_emu::widen_bits(RAW(h).x, FMT); } \
    __device__ __forceinline__ short __##N##_as_short(T h) { return (short)RAW(h).x; }        \
    __device__ __forceinline__ unsigned short __##N##_as_ushort(T h) { return RAW(h).x; }     \
    __device__ __forceinline__ T __short_as_##N(short v) { return RAW{(unsigned short)v}; }   \
    __device__ __forceinline__ T __ushort_as_##N(unsigned short v) { return RAW{v}; }         \
    __device__ __forceinline__ T2 make_##N##2(T a, T b) { return T2(a, b); }                  \
    __device__ __forceinline__ T2 __halves2##N##2(T a, T b) { return T2(a, b); }              \
    __device__ __forceinline__ T2 __##N##2##N##2(T a) { return T2(a, a); }                    \
    __device__ __forceinline__ T2 __float2##N##2_rn(float v) { T h = __float2##N(v); return T2(h, h); } \
    __device__ __forceinline__ T2 __floats2##N##2_rn(float a, float b) {                      \
        return T2(__float2##N(a), __float2##N(b));                                             \
    }                                                                                          \
    __device__ __forceinline__ T2 __float22##N##2_rn(float2 v) {                              \
        return T2(__float2##N(v.x), __float2##N(v.y));                                         \
    }                                                                                          \
    __device__ __forceinline__ float2 __##N##22float2(T2 v) { return make_float2(v.x, v.y); } \
    __device__ __forceinline__ T __low2##N(T2 v) { return v.x; }                              \
    __device__ __forceinline__ T __high2##N(T2 v) { return v.y; }                             \
    __device__ __forceinline__ T2 __low2##N##2(T2 v) { return T2(v.x, v.x); }                 \
    __device__ __forceinline__ T2 __high2##N##2(T2 v) { return T2(v.y, v.y); }                \
    __device__ __forceinline__ T2 __lows2##N##2(T2 a, T2 b) { return T2(a.x, b.x); }          \
    __device__ __forceinline__ T2 __highs2##N##2(T2 a, T2 b) { return T2(a.y, b.y); }         \
    __device__ __forceinline__ T2 __lowhigh2highlow(T2 v) { return T2(v.y, v.x); }            \
    KILN_EMU_MODES(KILN_EMU_FLOAT16_MODE_##N)

// The rounding-mode variants of one type's conversions (instantiated per N by the headers,
// which define KILN_EMU_FLOAT16_MODE_<N>(SUF, MODE) as KILN_EMU_FLOAT16_MODE(T, RAW, FMT, N, ...)).
#define KILN_EMU_FLOAT16_MODE(T, RAW, FMT, N, SUF, MODE)                                         \
    __device__ __forceinline__ T __float2##N##_##SUF(float v) {                                 \
        return RAW{(unsigned short)kiln_emu::double_bits_to(v, FMT, kiln_emu::Round::MODE)};    \
    }                                                                                           \
    KILN_EMU_FLOAT16_FROM_INT(T, RAW, FMT, short, short, SUF, MODE, N)                          \
    KILN_EMU_FLOAT16_FROM_INT(T, RAW, FMT, ushort, unsigned short, SUF, MODE, N)                \
    KILN_EMU_FLOAT16_FROM_INT(T, RAW, FMT, int, int, SUF, MODE, N)                              \
    KILN_EMU_FLOAT16_FROM_INT(T, RAW, FMT, uint, unsigned int, SUF, MODE, N)                    \
    KILN_EMU_FLOAT16_FROM_INT(T, RAW, FMT, ll, long long, SUF, MODE, N)                         \
    KILN_EMU_FLOAT16_FROM_INT(T, RAW, FMT, ull, unsigned long long, SUF, MODE, N)
#define KILN_EMU_FLOAT16_FROM_INT(T, RAW, FMT, IN, I, SUF, MODE, N)                               \
    __device__ __forceinline__ T __##IN##2##N##_##SUF(I v) {                                     \
        return RAW{(unsigned short)kiln_emu::round_bits(kiln_emu::negative(v), kiln_emu::magnitude(v), \
                                                        0, FMT, kiln_emu::Round::MODE)};         \
    }                                                                                            \
    __device__ __forceinline__ I __##N##2##IN##_##SUF(T h) {                                     \
        return kiln_emu::to_integer<I>(float(h), kiln_emu::Round::MODE);                         \
    }

#endif  // KILN_EMU_FLOAT16_H
