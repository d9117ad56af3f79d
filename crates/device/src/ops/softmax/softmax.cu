// Softmax and log-softmax over the last dim (launched from cuda.rs; compiled at first use by
// NVRTC and checked for sm_80/sm_90 by `cargo xtask kernels`).
//
//   kiln_softmax_<t>(const T* x, StridedArgs rows, u64 col_stride, T* out, u64 n_rows, u64 d, int log)
//       t: f32 f64 f16 bf16
//
// `rows` walks the n_rows leading indices (its offset is the view's); element k of a row sits at
// `rows(i) + k * col_stride`. One block per row (grid-stride over rows). Three passes over the
// row as the CPU kernel does: the max (NaN-propagating), the sum of exp(x - max) accumulated in
// double, then the outputs written contiguously. Halves compute in f32, f64 in double. Block-wide
// combination by warp shuffles and one shared step: a fixed order, so deterministic.
// blockDim.x must be a multiple of 32.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "kiln_common.cuh"

// The same numbers launch.rs asserts for its #[repr(C)] twin.

__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ double widen(double v) { return v; }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }

__device__ __forceinline__ void narrow_to(float* p, float v) { *p = v; }
__device__ __forceinline__ void narrow_to(double* p, double v) { *p = v; }
__device__ __forceinline__ void narrow_to(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void narrow_to(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

__device__ __forceinline__ float k_exp(float x) { return expf(x); }
__device__ __forceinline__ double k_exp(double x) { return exp(x); }

template <typename C> __device__ __forceinline__ C nan_max(C a, C b) {
    return (a != a || a > b) ? a : b;
}

// Block-wide combination; the result is returned to every thread.
template <typename V, typename F> __device__ __forceinline__ V block_all(V v, V identity, F f) {
    __shared__ V warp_values[32];
    __shared__ V result;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
    for (int o = 16; o > 0; o >>= 1) v = f(v, __shfl_down_sync(0xffffffffu, v, o));
    if (lane == 0) warp_values[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < warps ? warp_values[lane] : identity;
        for (int o = 16; o > 0; o >>= 1) v = f(v, __shfl_down_sync(0xffffffffu, v, o));
        if (lane == 0) result = v;
    }
    __syncthreads();
    v = result;
    __syncthreads(); // `result` and `warp_values` are reused by the next call
    return v;
}

struct MaxF {
    __device__ float operator()(float a, float b) const { return nan_max(a, b); }
};
struct MaxD {
    __device__ double operator()(double a, double b) const { return nan_max(a, b); }
};
struct AddD {
    __device__ double operator()(double a, double b) const { return a + b; }
};

__device__ __forceinline__ float neg_inf(float) { return __int_as_float(0xff800000); }
__device__ __forceinline__ double neg_inf(double) { return __longlong_as_double(0xfff0000000000000LL); }

__device__ __forceinline__ float block_max(float v) { return block_all(v, neg_inf(v), MaxF()); }
__device__ __forceinline__ double block_max(double v) { return block_all(v, neg_inf(v), MaxD()); }

template <typename T, typename C>
__device__ __forceinline__ void softmax_impl(const T* __restrict__ x, const StridedArgs& rows,
                                             u64 col_stride, T* __restrict__ out, u64 n_rows,
                                             u64 d, int log) {
    for (u64 row = blockIdx.x; row < n_rows; row += gridDim.x) {
        const T* in = x + strided_at(rows, row);
        T* dst = out + row * d;
        C m = neg_inf((C)0);
        for (u64 k = threadIdx.x; k < d; k += blockDim.x) m = nan_max(m, widen(in[k * col_stride]));
        m = block_max(m);
        double sum = 0.0;
        for (u64 k = threadIdx.x; k < d; k += blockDim.x) {
            sum += (double)k_exp(widen(in[k * col_stride]) - m);
        }
        sum = block_all(sum, 0.0, AddD());
        if (log) {
            const C lse = (C)::log(sum);
            for (u64 k = threadIdx.x; k < d; k += blockDim.x) {
                narrow_to(&dst[k], widen(in[k * col_stride]) - m - lse);
            }
        } else {
            const C inv = (C)(1.0 / sum);
            for (u64 k = threadIdx.x; k < d; k += blockDim.x) {
                narrow_to(&dst[k], k_exp(widen(in[k * col_stride]) - m) * inv);
            }
        }
    }
}

#define KILN_SOFTMAX(NAME, T, C)                                                               \
    extern "C" __global__ void kiln_softmax_##NAME(const T* __restrict__ x, StridedArgs rows,   \
                                                   u64 col_stride, T* __restrict__ out,         \
                                                   u64 n_rows, u64 d, int log) {                \
        softmax_impl<T, C>(x, rows, col_stride, out, n_rows, d, log);                          \
    }

KILN_SOFTMAX(f32, float, float)
KILN_SOFTMAX(f64, double, double)
KILN_SOFTMAX(f16, __half, float)
KILN_SOFTMAX(bf16, __nv_bfloat16, float)
