// Copies and casts of strided views (launched from cuda.rs; compiled at first use by NVRTC and
// checked for sm_80/sm_90 by `cargo xtask kernels`).
//
//   kiln_cast_<src>_<dst>(const S* src, StridedArgs in, D* dst, u64 n)
//       dst[i] = convert(src[in(i)]), dst contiguous; every pair of the 7 dtypes (same pair = copy)
//   kiln_copy_into_b<bytes>(const T* src, StridedArgs in, T* dst, StridedArgs out, u64 n)
//       dst[out(i)] = src[in(i)]: bit copy through a strided destination, per element size
//
// Conversions follow the CPU exactly: every value goes through double (as `Element::to_f64` /
// `from_f64` do); float -> integer truncates toward zero and saturates, NaN -> 0; -> bool is
// `!= 0`; double -> f16 rounds through f32 (as the `half` crate does on x86 with F16C), double ->
// bf16 drops the low 32 mantissa bits before rounding (as `half`'s conversion does).
// Grid-stride loops over 64-bit indices: any n with a capped 1-D grid.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "kiln_common.cuh"

// The same numbers launch.rs asserts for its #[repr(C)] twin.

// Bool is stored as one byte like u8 but converts differently.
struct kiln_bool {
    unsigned char v;
};

__device__ __forceinline__ double to_f64(float v) { return (double)v; }
__device__ __forceinline__ double to_f64(double v) { return v; }
__device__ __forceinline__ double to_f64(__half v) { return (double)__half2float(v); }
__device__ __forceinline__ double to_f64(__nv_bfloat16 v) { return (double)__bfloat162float(v); }
__device__ __forceinline__ double to_f64(i64 v) { return __ll2double_rn(v); }
__device__ __forceinline__ double to_f64(unsigned char v) { return (double)v; }
__device__ __forceinline__ double to_f64(kiln_bool v) { return v.v ? 1.0 : 0.0; }

template <typename T> __device__ __forceinline__ T from_f64(double v);
template <> __device__ __forceinline__ float from_f64<float>(double v) { return __double2float_rn(v); }
template <> __device__ __forceinline__ double from_f64<double>(double v) { return v; }
template <> __device__ __forceinline__ __half from_f64<__half>(double v) {
    return __float2half_rn(__double2float_rn(v));
}
template <> __device__ __forceinline__ __nv_bfloat16 from_f64<__nv_bfloat16>(double v) {
    const u64 bits = (u64)__double_as_longlong(v);
    if ((bits & 0x7FF0000000000000ULL) == 0x7FF0000000000000ULL) {
        return __double2bfloat16(v); // inf / NaN: keep as is
    }
    return __double2bfloat16(__longlong_as_double((i64)(bits & 0xFFFFFFFF00000000ULL)));
}
template <> __device__ __forceinline__ i64 from_f64<i64>(double v) {
    if (v != v) return 0;
    if (v >= 9223372036854775808.0) return 0x7FFFFFFFFFFFFFFFLL;
    if (v <= -9223372036854775808.0) return (i64)0x8000000000000000ULL;
    return __double2ll_rz(v);
}
template <> __device__ __forceinline__ unsigned char from_f64<unsigned char>(double v) {
    if (!(v > 0.0)) return 0; // negative, zero and NaN
    if (v >= 255.0) return 255;
    return (unsigned char)__double2uint_rz(v);
}
template <> __device__ __forceinline__ kiln_bool from_f64<kiln_bool>(double v) {
    kiln_bool b;
    b.v = (v != 0.0) ? 1 : 0;
    return b;
}

template <typename S, typename D>
__device__ __forceinline__ void cast_impl(const S* __restrict__ src, const StridedArgs& in,
                                          D* __restrict__ dst, u64 n) {
    const u64 step = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        dst[i] = from_f64<D>(to_f64(src[strided_at(in, i)]));
    }
}

#define KILN_CAST(SN, S, DN, D)                                                              \
    extern "C" __global__ void kiln_cast_##SN##_##DN(const S* __restrict__ src, StridedArgs in, \
                                                      D* __restrict__ dst, u64 n) {          \
        cast_impl<S, D>(src, in, dst, n);                                                    \
    }

#define KILN_CAST_FROM(SN, S)                \
    KILN_CAST(SN, S, f32, float)             \
    KILN_CAST(SN, S, f64, double)            \
    KILN_CAST(SN, S, f16, __half)            \
    KILN_CAST(SN, S, bf16, __nv_bfloat16)    \
    KILN_CAST(SN, S, i64, i64)               \
    KILN_CAST(SN, S, u8, unsigned char)      \
    KILN_CAST(SN, S, bool, kiln_bool)

KILN_CAST_FROM(f32, float)
KILN_CAST_FROM(f64, double)
KILN_CAST_FROM(f16, __half)
KILN_CAST_FROM(bf16, __nv_bfloat16)
KILN_CAST_FROM(i64, i64)
KILN_CAST_FROM(u8, unsigned char)
KILN_CAST_FROM(bool, kiln_bool)

template <typename T>
__device__ __forceinline__ void copy_into_impl(const T* __restrict__ src, const StridedArgs& in,
                                               T* __restrict__ dst, const StridedArgs& out, u64 n) {
    const u64 step = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        dst[strided_at(out, i)] = src[strided_at(in, i)];
    }
}

#define KILN_COPY_INTO(BYTES, T)                                                               \
    extern "C" __global__ void kiln_copy_into_b##BYTES(const T* __restrict__ src, StridedArgs in, \
                                                        T* __restrict__ dst, StridedArgs out,   \
                                                        u64 n) {                                \
        copy_into_impl<T>(src, in, dst, out, n);                                                \
    }

KILN_COPY_INTO(1, unsigned char)
KILN_COPY_INTO(2, unsigned short)
KILN_COPY_INTO(4, unsigned int)
KILN_COPY_INTO(8, u64)
