// Elementwise kernels over strided (broadcast) views (launched from cuda.rs; compiled at first use
// by NVRTC and checked for sm_80/sm_90 by `cargo xtask kernels`).
//
//   kiln_unary_<t>(const T* x, StridedArgs lx, T* out, u64 n, unsigned op, unsigned access)
//                                                                       t: f32 f64 f16 bf16 i64
//   kiln_binary_<t>(const T* a, StridedArgs la, const T* b, StridedArgs lb, T* out, u64 n,
//                   unsigned op, unsigned access)
//   kiln_binary_into_<t>(T* dst, StridedArgs ld, const T* b, StridedArgs lb, u64 n, unsigned op)
//                   (in place: dst = op(dst, b), both through their strides)
//   kiln_add_scaled_into_<t>(T* dst, StridedArgs ld, const T* b, StridedArgs lb, u64 n, C alpha)
//                   (in place: dst = dst + alpha * b rounded once; C = double for f64, else
//                   float)                                                t: f32 f64 f16 bf16
//   kiln_compare_<t>(const T* a, StridedArgs la, const T* b, StridedArgs lb, u8* out, u64 n,
//                    unsigned op, unsigned access)                               t: every dtype
//   kiln_where_b<bytes>(const u8* c, StridedArgs lc, const T* t, StridedArgs lt,
//                       const T* f, StridedArgs lf, T* out, u64 n, unsigned access)
//
// `op` is the op's code: the UNARY_*/BINARY_*/CMP_* defines of kiln_op_codes.cuh, a header
// generated from the op tables in ops/elementwise/mod.rs (the Rust enums' `code()`), so the two
// sides cannot drift apart. The op is a kernel argument, uniform across the grid, so the switch
// costs one predictable branch.
// Half types compute in f32 and round once per op, as the CPU backend does; f64 computes in
// double. Outputs are contiguous. Grid-stride loops with 64-bit indices.
//
// Unary and binary ops take `access` (ACCESS_*, picked on the host by `launch::flat_access`):
// through the strides; contiguous (every operand unit-stride after collapsing: x[offset + i],
// no index math); or vector (contiguous and every operand and the output 16-byte aligned at
// its first element: one 16-byte load per operand and one store per 16 bytes of output, the
// last n % (16 / sizeof(T)) elements element-wise). Comparisons and `where` (whose operands
// differ in element size) take the strided and contiguous paths only. Strided reads of views
// under 2^32 elements do their index math in 32 bits (strided_at32).

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "kiln_common.cuh"
#include "kiln_op_codes.cuh"

// True when indices below n take strided_at32.
__device__ __forceinline__ bool fits32(u64 n) { return n <= 0xFFFFFFFFull; }

#define ACCESS_STRIDED 0
#define ACCESS_CONTIGUOUS 1
#define ACCESS_VECTOR 2

// 16 bytes of T, moved with one vector instruction.
template <typename T> struct alignas(16) Pack {
    T v[16 / sizeof(T)];
};

// out[i] = f(x[i]) over n elements read as `access` says.
template <typename T, typename F>
__device__ __forceinline__ void map1(const T* __restrict__ x, const StridedArgs& lx,
                                     T* __restrict__ out, u64 n, unsigned access, F f) {
    if (access == ACCESS_VECTOR) {
        constexpr int V = 16 / sizeof(T);
        const T* xs = x + lx.offset;
        const u64 packs = n / V;
        GRID_STRIDE(k, packs) {
            const Pack<T> a = reinterpret_cast<const Pack<T>*>(xs)[k];
            Pack<T> o;
#pragma unroll
            for (int e = 0; e < V; ++e) o.v[e] = f(a.v[e]);
            reinterpret_cast<Pack<T>*>(out)[k] = o;
        }
        GRID_STRIDE(t, n - packs * V) { out[packs * V + t] = f(xs[packs * V + t]); }
    } else if (access == ACCESS_CONTIGUOUS) {
        const T* xs = x + lx.offset;
        GRID_STRIDE(i, n) { out[i] = f(xs[i]); }
    } else if (fits32(n)) {
        GRID_STRIDE(i, n) { out[i] = f(x[strided_at32(lx, (unsigned)i)]); }
    } else {
        GRID_STRIDE(i, n) { out[i] = f(x[strided_at(lx, i)]); }
    }
}

// out[i] = f(a[i], b[i]) over n elements read as `access` says.
template <typename T, typename F>
__device__ __forceinline__ void map2(const T* __restrict__ a, const StridedArgs& la,
                                     const T* __restrict__ b, const StridedArgs& lb,
                                     T* __restrict__ out, u64 n, unsigned access, F f) {
    if (access == ACCESS_VECTOR) {
        constexpr int V = 16 / sizeof(T);
        const T* as = a + la.offset;
        const T* bs = b + lb.offset;
        const u64 packs = n / V;
        GRID_STRIDE(k, packs) {
            const Pack<T> pa = reinterpret_cast<const Pack<T>*>(as)[k];
            const Pack<T> pb = reinterpret_cast<const Pack<T>*>(bs)[k];
            Pack<T> o;
#pragma unroll
            for (int e = 0; e < V; ++e) o.v[e] = f(pa.v[e], pb.v[e]);
            reinterpret_cast<Pack<T>*>(out)[k] = o;
        }
        GRID_STRIDE(t, n - packs * V) {
            const u64 i = packs * V + t;
            out[i] = f(as[i], bs[i]);
        }
    } else if (access == ACCESS_CONTIGUOUS) {
        const T* as = a + la.offset;
        const T* bs = b + lb.offset;
        GRID_STRIDE(i, n) { out[i] = f(as[i], bs[i]); }
    } else if (fits32(n)) {
        GRID_STRIDE(i, n) {
            out[i] = f(a[strided_at32(la, (unsigned)i)], b[strided_at32(lb, (unsigned)i)]);
        }
    } else {
        GRID_STRIDE(i, n) { out[i] = f(a[strided_at(la, i)], b[strided_at(lb, i)]); }
    }
}

// ---- storage type <-> compute type ----
__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ double widen(double v) { return v; }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T, typename C> __device__ __forceinline__ T narrow(C v);
template <> __device__ __forceinline__ float narrow<float, float>(float v) { return v; }
template <> __device__ __forceinline__ double narrow<double, double>(double v) { return v; }
template <> __device__ __forceinline__ __half narrow<__half, float>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16, float>(float v) {
    return __float2bfloat16_rn(v);
}

// ---- math in the compute type (float or double) ----
__device__ __forceinline__ float k_exp(float x) { return expf(x); }
__device__ __forceinline__ double k_exp(double x) { return exp(x); }
__device__ __forceinline__ float k_log(float x) { return logf(x); }
__device__ __forceinline__ double k_log(double x) { return log(x); }
__device__ __forceinline__ float k_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double k_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float k_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double k_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float k_erf(float x) { return erff(x); }
__device__ __forceinline__ double k_erf(double x) { return erf(x); }
__device__ __forceinline__ float k_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double k_abs(double x) { return fabs(x); }
__device__ __forceinline__ float k_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double k_pow(double x, double y) { return pow(x, y); }

template <typename C> __device__ __forceinline__ C k_sigmoid(C x) {
    return (C)1 / ((C)1 + k_exp(-x));
}

// The derivatives behind the fused activation backwards (BINARY_*_BACKWARD).
template <typename C> __device__ __forceinline__ C gelu_erf_grad(C x) {
    const C cdf = (C)0.5 * ((C)1 + k_erf(x * (C)0.70710678118654752440));
    const C pdf = k_exp((C)-0.5 * x * x) * (C)0.3989422804014327;
    return cdf + x * pdf;
}

template <typename C> __device__ __forceinline__ C gelu_tanh_grad(C x) {
    const C one = (C)1, half = (C)0.5, sqrt_2_over_pi = (C)0.7978845608028654;
    const C t = k_tanh(sqrt_2_over_pi * (x + (C)0.044715 * x * x * x));
    const C dinner = sqrt_2_over_pi * (one + (C)(3.0 * 0.044715) * x * x);
    return half * (one + t) + half * x * (one - t * t) * dinner;
}

template <typename C> __device__ __forceinline__ C silu_grad(C x) {
    const C s = k_sigmoid(x);
    return s * ((C)1 + x * ((C)1 - s));
}

template <typename C> __device__ __forceinline__ C unary_float(unsigned op, C x) {
    const C one = (C)1, half = (C)0.5, zero = (C)0;
    const C frac_1_sqrt_2 = (C)0.70710678118654752440;
    const C sqrt_2_over_pi = (C)0.7978845608028654;
    const C coef = (C)0.044715;
    switch (op) {
    case UNARY_NEG: return -x;
    case UNARY_EXP: return k_exp(x);
    case UNARY_LOG: return k_log(x);
    case UNARY_SQRT: return k_sqrt(x);
    case UNARY_RSQRT: return one / k_sqrt(x);
    case UNARY_ABS: return k_abs(x);
    case UNARY_RELU: return x <= zero ? zero : x; // NaN stays NaN
    case UNARY_GELU_ERF: return half * x * (one + k_erf(x * frac_1_sqrt_2));
    case UNARY_GELU_TANH:
        return half * x * (one + k_tanh(sqrt_2_over_pi * (x + coef * x * x * x)));
    case UNARY_SIGMOID: return k_sigmoid(x);
    case UNARY_TANH: return k_tanh(x);
    case UNARY_SILU: return x * k_sigmoid(x);
    case UNARY_SIGN: return x > zero ? one : (x < zero ? -one : x);
    case UNARY_ERF: return k_erf(x);
    case UNARY_RECIP: return one / x;
    case UNARY_SQUARE: return x * x;
    default: return x;
    }
}

// Integer ops wrap like Rust's wrapping_* (unsigned arithmetic, no signed overflow UB).
__device__ __forceinline__ i64 unary_int(unsigned op, i64 x) {
    const u64 ux = (u64)x;
    switch (op) {
    case UNARY_NEG: return (i64)(0ULL - ux);
    case UNARY_ABS: return x < 0 ? (i64)(0ULL - ux) : x;
    case UNARY_RELU: return x > 0 ? x : 0;
    case UNARY_SIGN: return (i64)(x > 0) - (i64)(x < 0);
    case UNARY_SQUARE: return (i64)(ux * ux);
    default: return x;
    }
}

#define KILN_UNARY(NAME, T)                                                                  \
    extern "C" __global__ void kiln_unary_##NAME(const T* __restrict__ x, StridedArgs lx,     \
                                                 T* __restrict__ out, u64 n, unsigned op,     \
                                                 unsigned access) {                           \
        map1(x, lx, out, n, access,                                                          \
             [op](T v) { return narrow<T>(unary_float(op, widen(v))); });                     \
    }

KILN_UNARY(f32, float)
KILN_UNARY(f64, double)
KILN_UNARY(f16, __half)
KILN_UNARY(bf16, __nv_bfloat16)

extern "C" __global__ void kiln_unary_i64(const i64* __restrict__ x, StridedArgs lx,
                                          i64* __restrict__ out, u64 n, unsigned op,
                                          unsigned access) {
    map1(x, lx, out, n, access, [op](i64 v) { return unary_int(op, v); });
}

template <typename C> __device__ __forceinline__ C binary_float(unsigned op, C a, C b) {
    switch (op) {
    case BINARY_ADD: return a + b;
    case BINARY_SUB: return a - b;
    case BINARY_MUL: return a * b;
    case BINARY_DIV: return a / b;
    case BINARY_POW: return k_pow(a, b);
    case BINARY_MAXIMUM: return (a != a || a > b) ? a : b; // NaN-propagating
    case BINARY_MINIMUM: return (a != a || a < b) ? a : b;
    case BINARY_RELU_BACKWARD: return b <= (C)0 ? (C)0 : a; // threshold_backward
    case BINARY_GELU_ERF_BACKWARD: return a * gelu_erf_grad(b);
    case BINARY_GELU_TANH_BACKWARD: return a * gelu_tanh_grad(b);
    case BINARY_SILU_BACKWARD: return a * silu_grad(b);
    case BINARY_SIGMOID_BACKWARD: return a * ((C)1 - b) * b;
    case BINARY_TANH_BACKWARD: return a * ((C)1 - b * b);
    default: return a;
    }
}

__device__ __forceinline__ i64 binary_int(unsigned op, i64 a, i64 b) {
    switch (op) {
    case BINARY_ADD: return (i64)((u64)a + (u64)b);
    case BINARY_SUB: return (i64)((u64)a - (u64)b);
    case BINARY_MUL: return (i64)((u64)a * (u64)b);
    case BINARY_DIV: // Rust's checked_div(..).unwrap_or(0): 0 on division by zero and on overflow
        if (b == 0 || (b == -1 && a == (i64)0x8000000000000000ULL)) return 0;
        return a / b;
    case BINARY_MAXIMUM: return a > b ? a : b;
    case BINARY_MINIMUM: return a < b ? a : b;
    default: return a;
    }
}

#define KILN_BINARY(NAME, T)                                                                  \
    extern "C" __global__ void kiln_binary_##NAME(const T* __restrict__ a, StridedArgs la,     \
                                                  const T* __restrict__ b, StridedArgs lb,     \
                                                  T* __restrict__ out, u64 n, unsigned op,     \
                                                  unsigned access) {                           \
        map2(a, la, b, lb, out, n, access,                                                    \
             [op](T x, T y) { return narrow<T>(binary_float(op, widen(x), widen(y))); });      \
    }

KILN_BINARY(f32, float)
KILN_BINARY(f64, double)
KILN_BINARY(f16, __half)
KILN_BINARY(bf16, __nv_bfloat16)

extern "C" __global__ void kiln_binary_i64(const i64* __restrict__ a, StridedArgs la,
                                           const i64* __restrict__ b, StridedArgs lb,
                                           i64* __restrict__ out, u64 n, unsigned op,
                                           unsigned access) {
    map2(a, la, b, lb, out, n, access, [op](i64 x, i64 y) { return binary_int(op, x, y); });
}

// dst[i] = f(dst[i], b[i]) in place, both read through their strides. `dst` is read and
// written at the same element by the same thread, so it is not __restrict__; the host refuses a
// destination view that maps two elements to one place.
template <typename T, typename F>
__device__ __forceinline__ void assign2(T* dst, const StridedArgs& ld, const T* __restrict__ b,
                                        const StridedArgs& lb, u64 n, F f) {
    GRID_STRIDE(i, n) {
        const u64 o = strided_at(ld, i);
        dst[o] = f(dst[o], b[strided_at(lb, i)]);
    }
}

#define KILN_BINARY_INTO(NAME, T)                                                             \
    extern "C" __global__ void kiln_binary_into_##NAME(T* dst, StridedArgs ld,                \
                                                       const T* __restrict__ b, StridedArgs lb, \
                                                       u64 n, unsigned op) {                  \
        assign2(dst, ld, b, lb, n,                                                            \
                [op](T x, T y) { return narrow<T>(binary_float(op, widen(x), widen(y))); });   \
    }

KILN_BINARY_INTO(f32, float)
KILN_BINARY_INTO(f64, double)
KILN_BINARY_INTO(f16, __half)
KILN_BINARY_INTO(bf16, __nv_bfloat16)

extern "C" __global__ void kiln_binary_into_i64(i64* dst, StridedArgs ld,
                                                const i64* __restrict__ b, StridedArgs lb, u64 n,
                                                unsigned op) {
    assign2(dst, ld, b, lb, n, [op](i64 x, i64 y) { return binary_int(op, x, y); });
}

// dst[i] = dst[i] + alpha * b[i] in place, one rounding (fmaf / fma: PyTorch's add_ with alpha);
// halves fuse in f32 (the host passes alpha rounded to the half type, as the CPU kernel uses it)
// and round once.
__device__ __forceinline__ float k_fma(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double k_fma(double a, double b, double c) { return fma(a, b, c); }

#define KILN_ADD_SCALED_INTO(NAME, T, C)                                                      \
    extern "C" __global__ void kiln_add_scaled_into_##NAME(T* dst, StridedArgs ld,            \
                                                           const T* __restrict__ b,           \
                                                           StridedArgs lb, u64 n, C alpha) {  \
        assign2(dst, ld, b, lb, n,                                                            \
                [alpha](T x, T y) { return narrow<T>(k_fma(widen(y), alpha, widen(x))); });   \
    }

KILN_ADD_SCALED_INTO(f32, float, float)
KILN_ADD_SCALED_INTO(f64, double, double)
KILN_ADD_SCALED_INTO(f16, __half, float)
KILN_ADD_SCALED_INTO(bf16, __nv_bfloat16, float)

// Halves compare exactly after widening; NaN compares like IEEE (only != is true).
__device__ __forceinline__ float cmp_key(__half v) { return __half2float(v); }
__device__ __forceinline__ float cmp_key(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float cmp_key(float v) { return v; }
__device__ __forceinline__ double cmp_key(double v) { return v; }
__device__ __forceinline__ i64 cmp_key(i64 v) { return v; }
__device__ __forceinline__ unsigned cmp_key(unsigned char v) { return v; }

template <typename K> __device__ __forceinline__ bool compare(unsigned op, K a, K b) {
    switch (op) {
    case CMP_EQ: return a == b;
    case CMP_NE: return a != b;
    case CMP_LT: return a < b;
    case CMP_LE: return a <= b;
    case CMP_GT: return a > b;
    case CMP_GE: return a >= b;
    default: return false;
    }
}

#define KILN_COMPARE(NAME, T)                                                                  \
    extern "C" __global__ void kiln_compare_##NAME(const T* __restrict__ a, StridedArgs la,     \
                                                   const T* __restrict__ b, StridedArgs lb,     \
                                                   unsigned char* __restrict__ out, u64 n,      \
                                                   unsigned op, unsigned access) {              \
        if (access == ACCESS_STRIDED && fits32(n)) {                                           \
            GRID_STRIDE(i, n) {                                                                \
                out[i] = compare(op, cmp_key(a[strided_at32(la, (unsigned)i)]),                \
                                 cmp_key(b[strided_at32(lb, (unsigned)i)])) ? 1 : 0;           \
            }                                                                                  \
        } else if (access == ACCESS_STRIDED) {                                                 \
            GRID_STRIDE(i, n) {                                                                \
                out[i] = compare(op, cmp_key(a[strided_at(la, i)]),                            \
                                 cmp_key(b[strided_at(lb, i)])) ? 1 : 0;                       \
            }                                                                                  \
        } else {                                                                               \
            const T* as = a + la.offset;                                                       \
            const T* bs = b + lb.offset;                                                       \
            GRID_STRIDE(i, n) { out[i] = compare(op, cmp_key(as[i]), cmp_key(bs[i])) ? 1 : 0; } \
        }                                                                                      \
    }

KILN_COMPARE(f32, float)
KILN_COMPARE(f64, double)
KILN_COMPARE(f16, __half)
KILN_COMPARE(bf16, __nv_bfloat16)
KILN_COMPARE(i64, i64)
KILN_COMPARE(u8, unsigned char)
KILN_COMPARE(bool, unsigned char)

// where moves bits, so it is instantiated per element size.
#define KILN_WHERE(BYTES, T)                                                                   \
    extern "C" __global__ void kiln_where_b##BYTES(                                            \
        const unsigned char* __restrict__ c, StridedArgs lc, const T* __restrict__ t,           \
        StridedArgs lt, const T* __restrict__ f, StridedArgs lf, T* __restrict__ out, u64 n,    \
        unsigned access) {                                                                     \
        if (access == ACCESS_STRIDED && fits32(n)) {                                           \
            GRID_STRIDE(i, n) {                                                                \
                const unsigned k = (unsigned)i;                                                \
                out[i] = c[strided_at32(lc, k)] != 0 ? t[strided_at32(lt, k)]                  \
                                                     : f[strided_at32(lf, k)];                 \
            }                                                                                  \
        } else if (access == ACCESS_STRIDED) {                                                 \
            GRID_STRIDE(i, n) {                                                                \
                out[i] = c[strided_at(lc, i)] != 0 ? t[strided_at(lt, i)] : f[strided_at(lf, i)]; \
            }                                                                                  \
        } else {                                                                               \
            const unsigned char* cs = c + lc.offset;                                           \
            const T* ts = t + lt.offset;                                                       \
            const T* fs = f + lf.offset;                                                       \
            GRID_STRIDE(i, n) { out[i] = cs[i] != 0 ? ts[i] : fs[i]; }                         \
        }                                                                                      \
    }

KILN_WHERE(1, unsigned char)
KILN_WHERE(2, unsigned short)
KILN_WHERE(4, unsigned int)
KILN_WHERE(8, u64)
