// Top-k along the last dim (launched from cuda.rs; compiled at first use by NVRTC and checked for
// sm_80/sm_90 by `cargo xtask kernels`).
//
//   kiln_topk_<t>(const T* x, StridedArgs rows, u64 col_stride, T* values, i64* indices,
//                 u64 n_rows, u64 d, u64 k, int largest)
//       t: f32 f64 f16 bf16 i64
//
// `rows` walks the n_rows leading indices (its offset is the view's); element j of a row sits at
// `rows(i) + j * col_stride`. One thread per row (grid-stride over rows), no scratch memory: the
// order is total (NaN above every number, then by value, equal values by position, the lower
// first; flipped in value for the smallest), so the r-th best element is the best of those that
// rank below the (r-1)-th, found by one pass over the row: O(k * d) per row, for the small k of
// inference. The CPU kernel (cpu.rs) sorts under the same order, so both agree bit for bit.
// Halves compare in f32 (exact), f64 in double, i64 as integers.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "kiln_common.cuh"

__device__ __forceinline__ float topk_key(float v) { return v; }
__device__ __forceinline__ double topk_key(double v) { return v; }
__device__ __forceinline__ float topk_key(__half v) { return __half2float(v); }
__device__ __forceinline__ float topk_key(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ i64 topk_key(i64 v) { return v; }

// -1, 0 or 1: a against b by value, NaN above every number (two NaNs are equal).
template <typename K> __device__ __forceinline__ int topk_value_order(K a, K b) {
    const bool a_nan = a != a, b_nan = b != b;
    if (a_nan || b_nan) return (int)a_nan - (int)b_nan;
    return (a > b) - (a < b);
}

// True when element (a, ia) ranks before (b, ib): better value first, then the lower position.
template <typename K>
__device__ __forceinline__ bool topk_before(K a, u64 ia, K b, u64 ib, int largest) {
    int by_value = topk_value_order(a, b);
    if (!largest) by_value = -by_value;
    if (by_value != 0) return by_value > 0;
    return ia < ib;
}

template <typename T>
__device__ __forceinline__ void topk_impl(const T* __restrict__ x, const StridedArgs& rows,
                                          u64 col_stride, T* __restrict__ values,
                                          i64* __restrict__ indices, u64 n_rows, u64 d, u64 k,
                                          int largest) {
    GRID_STRIDE(row, n_rows) {
        const T* in = x + strided_at(rows, row);
        T* out_values = values + row * k;
        i64* out_indices = indices + row * k;
        u64 prev = 0;
        for (u64 r = 0; r < k; ++r) {
            // The best element that ranks after the previous pick (any element for the first).
            u64 best = d;
            for (u64 j = 0; j < d; ++j) {
                const auto v = topk_key(in[j * col_stride]);
                if (r > 0 && !topk_before(topk_key(in[prev * col_stride]), prev, v, j, largest)) {
                    continue;
                }
                if (best == d || topk_before(v, j, topk_key(in[best * col_stride]), best, largest)) {
                    best = j;
                }
            }
            out_values[r] = in[best * col_stride];
            out_indices[r] = (i64)best;
            prev = best;
        }
    }
}

#define KILN_TOPK(NAME, T)                                                                      \
    extern "C" __global__ void kiln_topk_##NAME(const T* __restrict__ x, StridedArgs rows,       \
                                                u64 col_stride, T* __restrict__ values,          \
                                                i64* __restrict__ indices, u64 n_rows, u64 d,    \
                                                u64 k, int largest) {                            \
        topk_impl<T>(x, rows, col_stride, values, indices, n_rows, d, k, largest);              \
    }

KILN_TOPK(f32, float)
KILN_TOPK(f64, double)
KILN_TOPK(f16, __half)
KILN_TOPK(bf16, __nv_bfloat16)
KILN_TOPK(i64, i64)
