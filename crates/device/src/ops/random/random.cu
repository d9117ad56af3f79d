// Generated sequences: arange and Philox4x32-10 draws (launched from cuda.rs; compiled at first
// use by NVRTC and checked for sm_80/sm_90 by `cargo xtask kernels`).
//
//   kiln_arange_<t>(T* out, double start, double step, u64 n)          out[i] = start + step * i
//   kiln_rand_uniform_<t>(T* out, u64 n, double low, double high, u64 seed, u64 offset)
//   kiln_rand_normal_<t>(T* out, u64 n, double mean, double std, u64 seed, u64 offset)
//       t: f32 f64 f16 bf16 i64 u8 bool
//
// Each element depends only on its index, exactly as in ops/random/mod.rs: counter
// offset + i (64-bit, wrapping), key = seed, one Philox4x32-10 block per element; uniforms take
// 24 bits (53 for f64) of the block; normals are Box-Muller (cosine branch) in double over two
// 53-bit uniforms. Additions and products use explicitly rounded intrinsics (__dadd_rn,
// __dmul_rn) so NVRTC cannot contract them into FMAs: the integer work and the uniforms are
// bit-identical to the CPU; normals differ from the CPU's in the last bits of a double (the CPU
// computes ln and cos(2 pi u) with its own branch-free series, normal_math.rs), more where the
// cosine is near zero, since here 2 pi u is rounded before cos. Values are stored with the CPU's `from_f64` rules.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "kiln_common.cuh"

struct kiln_bool {
    unsigned char v;
};

template <typename T> __device__ __forceinline__ T from_f64(double v);
template <> __device__ __forceinline__ float from_f64<float>(double v) { return __double2float_rn(v); }
template <> __device__ __forceinline__ double from_f64<double>(double v) { return v; }
template <> __device__ __forceinline__ __half from_f64<__half>(double v) {
    return __float2half_rn(__double2float_rn(v));
}
template <> __device__ __forceinline__ __nv_bfloat16 from_f64<__nv_bfloat16>(double v) {
    const u64 bits = (u64)__double_as_longlong(v);
    if ((bits & 0x7FF0000000000000ULL) == 0x7FF0000000000000ULL) return __double2bfloat16(v);
    return __double2bfloat16(__longlong_as_double((i64)(bits & 0xFFFFFFFF00000000ULL)));
}
template <> __device__ __forceinline__ i64 from_f64<i64>(double v) {
    if (v != v) return 0;
    if (v >= 9223372036854775808.0) return 0x7FFFFFFFFFFFFFFFLL;
    if (v <= -9223372036854775808.0) return (i64)0x8000000000000000ULL;
    return __double2ll_rz(v);
}
template <> __device__ __forceinline__ unsigned char from_f64<unsigned char>(double v) {
    if (!(v > 0.0)) return 0;
    if (v >= 255.0) return 255;
    return (unsigned char)__double2uint_rz(v);
}
template <> __device__ __forceinline__ kiln_bool from_f64<kiln_bool>(double v) {
    kiln_bool b;
    b.v = (v != 0.0) ? 1 : 0;
    return b;
}

template <typename T> __device__ __forceinline__ void arange_impl(T* out, double start, double step, u64 n) {
    GRID_STRIDE(i, n) { out[i] = from_f64<T>(__dadd_rn(start, __dmul_rn(step, (double)i))); }
}

// ---- Philox4x32-10 ----
struct Block {
    unsigned int w[4];
};

__device__ __forceinline__ Block philox(u64 ctr, u64 seed) {
    unsigned int c0 = (unsigned int)ctr, c1 = (unsigned int)(ctr >> 32), c2 = 0, c3 = 0;
    unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)(seed >> 32);
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const unsigned int hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const unsigned int hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        const unsigned int n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
    }
    Block b;
    b.w[0] = c0;
    b.w[1] = c1;
    b.w[2] = c2;
    b.w[3] = c3;
    return b;
}

// Exact: a 53-bit integer times a power of two.
__device__ __forceinline__ double uniform53(unsigned int hi, unsigned int lo) {
    const u64 bits = ((u64)hi << 21) ^ ((u64)lo >> 11);
    return __dmul_rn(__ull2double_rn(bits), 1.0 / 9007199254740992.0);
}

__device__ __forceinline__ double uniform24(unsigned int w) {
    return __dmul_rn((double)(w >> 8), 1.0 / 16777216.0);
}

template <typename T>
__device__ __forceinline__ void uniform_impl(T* out, u64 n, double low, double high, u64 seed,
                                             u64 offset, bool wide) {
    const double span = __dsub_rn(high, low);
    GRID_STRIDE(i, n) {
        const Block b = philox(offset + i, seed);
        const double u = wide ? uniform53(b.w[0], b.w[1]) : uniform24(b.w[0]);
        out[i] = from_f64<T>(__dadd_rn(low, __dmul_rn(span, u)));
    }
}

template <typename T>
__device__ __forceinline__ void normal_impl(T* out, u64 n, double mean, double std, u64 seed,
                                            u64 offset) {
    const double tau = 6.283185307179586;
    GRID_STRIDE(i, n) {
        const Block b = philox(offset + i, seed);
        const double u1 = __dsub_rn(1.0, uniform53(b.w[0], b.w[1])); // (0, 1]: log is finite
        const double u2 = uniform53(b.w[2], b.w[3]);
        const double z = __dmul_rn(__dsqrt_rn(__dmul_rn(-2.0, log(u1))), cos(__dmul_rn(tau, u2)));
        out[i] = from_f64<T>(__dadd_rn(mean, __dmul_rn(std, z)));
    }
}

#define KILN_GENERATORS(NAME, T, WIDE)                                                          \
    extern "C" __global__ void kiln_arange_##NAME(T* __restrict__ out, double start, double step, \
                                                  u64 n) {                                      \
        arange_impl<T>(out, start, step, n);                                                    \
    }                                                                                           \
    extern "C" __global__ void kiln_rand_uniform_##NAME(T* __restrict__ out, u64 n, double low,  \
                                                        double high, u64 seed, u64 offset) {    \
        uniform_impl<T>(out, n, low, high, seed, offset, WIDE);                                 \
    }                                                                                           \
    extern "C" __global__ void kiln_rand_normal_##NAME(T* __restrict__ out, u64 n, double mean,  \
                                                       double std, u64 seed, u64 offset) {      \
        normal_impl<T>(out, n, mean, std, seed, offset);                                        \
    }

KILN_GENERATORS(f32, float, false)
KILN_GENERATORS(f64, double, true)
KILN_GENERATORS(f16, __half, false)
KILN_GENERATORS(bf16, __nv_bfloat16, false)
KILN_GENERATORS(i64, i64, false)
KILN_GENERATORS(u8, unsigned char, false)
KILN_GENERATORS(bool, kiln_bool, false)
