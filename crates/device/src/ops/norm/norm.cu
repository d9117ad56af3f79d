// Batch norm and layer norm, forward and backward (launched from cuda.rs; compiled at first use
// by NVRTC and checked for sm_80/sm_90 by `cargo xtask kernels`).
//
// Both norms are "statistics over groups of elements": stat s owns `count` elements of the
// contiguous input, element j of it at stat_at(s, j) = (j / inner) * outer_stride + s * inner
// + j % inner (layer norm: inner = count = cols, stat s = row s; batch norm over [N, C, S]:
// inner = S, outer_stride = C * S, count = N * S, stat s = channel s). For an element at flat
// index i, its stat is (i / stat_div) % stat_mod and its weight/bias index
// (i / param_div) % param_mod.
//
//   kiln_norm_stats_<t>(const T* x, NormArgs a, A* mean, A* var, A* rstd)
//       per stat, two passes (mean, then squared deviations); biased var, rstd = 1/sqrt(var+eps).
//   kiln_norm_apply_<t>(const T* x, NormArgs a, const A* mean, const A* rstd, const A* w,
//                       const A* b, T* y)                 y = (x - mean) * rstd [* w] [+ b]
//   kiln_norm_backward_sums_<t>(const T* go, const T* x, NormArgs a, const A* mean,
//                               const A* rstd, const A* w, A* sum_g, A* sum_gx)
//       per stat: sum of g and of g * xhat, xhat = (x - mean) * rstd, g = go * w when
//       sums_weighted (layer norm) else go (batch norm: the sums are then dbias and dweight).
//   kiln_norm_backward_dx_<t>(const T* go, const T* x, NormArgs a, const A* mean,
//                             const A* rstd, const A* w, const A* sum_g, const A* sum_gx, T* dx)
//       train: dx = rstd * (go * w - o * (sum_g + xhat * sum_gx) / count), o = 1 when the sums
//       are weighted, w otherwise; eval (batch norm on running statistics): dx = go * w * rstd.
//   kiln_layer_norm_param_grads_<t>(const T* go, const T* x, NormArgs a, const A* mean,
//                                   const A* rstd, A* dw, A* db)
//       per column j (one thread each, rows in order): dw = sum go * xhat, db = sum go.
//
// t: f32 f64 f16 bf16. T is the tensor's dtype, read and written directly (no widening pass);
// A (f32 for f32/f16/bf16, f64 for f64) holds statistics, weight/bias and per-element math, and
// every sum accumulates in double, as the CPU kernels do; each output rounds to T once. The
// stat kernels run one block per stat (grid-stride over stats), sum in a fixed order per
// thread and combine with a fixed shuffle tree, so results are deterministic. blockDim.x must
// be a multiple of 32 (the launcher uses 256). w and b may be null when has_w / has_b are 0.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "kiln_common.cuh"
#include "kiln_float.cuh"

// Must match `NormArgs` in cuda.rs field for field.
struct NormArgs {
    u64 n_stats, count, inner, outer_stride;
    u64 total, stat_div, stat_mod, param_div, param_mod;
    u64 has_w, has_b, sums_weighted, train;
    double eps;
};

// Walks j = threadIdx.x, + blockDim.x, ... over one stat's elements, tracking (j / inner,
// j % inner) by increments instead of a 64-bit division per element.
struct StatWalk {
    u64 q, r, step_q, step_r;
    __device__ __forceinline__ StatWalk(const NormArgs& a) {
        q = threadIdx.x / a.inner;
        r = threadIdx.x % a.inner;
        step_q = blockDim.x / a.inner;
        step_r = blockDim.x % a.inner;
    }
    __device__ __forceinline__ u64 at(const NormArgs& a, u64 s) const {
        return q * a.outer_stride + s * a.inner + r;
    }
    __device__ __forceinline__ void next(const NormArgs& a) {
        q += step_q;
        r += step_r;
        if (r >= a.inner) {
            r -= a.inner;
            ++q;
        }
    }
};

// Sums x and y over the block; every thread gets both totals.
__device__ __forceinline__ void block_sum2(double& x, double& y) {
    __shared__ double sx[32], sy[32];
    for (int o = 16; o > 0; o >>= 1) {
        x += __shfl_down_sync(0xffffffffu, x, o);
        y += __shfl_down_sync(0xffffffffu, y, o);
    }
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    __syncthreads(); // the previous call's readers are done with sx/sy
    if (lane == 0) {
        sx[warp] = x;
        sy[warp] = y;
    }
    __syncthreads();
    if (warp == 0) {
        const unsigned warps = blockDim.x >> 5;
        x = lane < warps ? sx[lane] : 0.0;
        y = lane < warps ? sy[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) {
            x += __shfl_down_sync(0xffffffffu, x, o);
            y += __shfl_down_sync(0xffffffffu, y, o);
        }
        if (lane == 0) {
            sx[0] = x;
            sy[0] = y;
        }
    }
    __syncthreads();
    x = sx[0];
    y = sy[0];
}

template <typename T>
__device__ __forceinline__ void stats_impl(const T* __restrict__ x, const NormArgs& a,
                                           typename Acc<T>::type* __restrict__ mean,
                                           typename Acc<T>::type* __restrict__ var,
                                           typename Acc<T>::type* __restrict__ rstd) {
    typedef typename Acc<T>::type A;
    for (u64 s = blockIdx.x; s < a.n_stats; s += gridDim.x) {
        double sum = 0.0, unused = 0.0;
        StatWalk walk(a);
        for (u64 j = threadIdx.x; j < a.count; j += blockDim.x, walk.next(a)) {
            sum += (double)widen(x[walk.at(a, s)]);
        }
        block_sum2(sum, unused);
        const double m = sum / (double)a.count;
        double squares = 0.0;
        unused = 0.0;
        StatWalk again(a);
        for (u64 j = threadIdx.x; j < a.count; j += blockDim.x, again.next(a)) {
            const double d = (double)widen(x[again.at(a, s)]) - m;
            squares += d * d;
        }
        block_sum2(squares, unused);
        if (threadIdx.x == 0) {
            const double v = squares / (double)a.count;
            mean[s] = (A)m;
            var[s] = (A)v;
            rstd[s] = (A)(1.0 / sqrt(v + a.eps));
        }
    }
}

template <typename T>
__device__ __forceinline__ void apply_impl(const T* __restrict__ x, const NormArgs& a,
                                           const typename Acc<T>::type* __restrict__ mean,
                                           const typename Acc<T>::type* __restrict__ rstd,
                                           const typename Acc<T>::type* __restrict__ w,
                                           const typename Acc<T>::type* __restrict__ b,
                                           T* __restrict__ y) {
    typedef typename Acc<T>::type A;
    GRID_STRIDE(i, a.total) {
        const u64 s = (i / a.stat_div) % a.stat_mod, p = (i / a.param_div) % a.param_mod;
        A v = (widen(x[i]) - mean[s]) * rstd[s];
        if (a.has_w) v *= w[p];
        if (a.has_b) v += b[p];
        store(&y[i], v);
    }
}

template <typename T>
__device__ __forceinline__ void backward_sums_impl(
    const T* __restrict__ go, const T* __restrict__ x, const NormArgs& a,
    const typename Acc<T>::type* __restrict__ mean, const typename Acc<T>::type* __restrict__ rstd,
    const typename Acc<T>::type* __restrict__ w, typename Acc<T>::type* __restrict__ sum_g,
    typename Acc<T>::type* __restrict__ sum_gx) {
    typedef typename Acc<T>::type A;
    const bool weighted = a.sums_weighted && a.has_w;
    for (u64 s = blockIdx.x; s < a.n_stats; s += gridDim.x) {
        const A m = mean[s], r = rstd[s];
        double s1 = 0.0, s2 = 0.0;
        StatWalk walk(a);
        for (u64 j = threadIdx.x; j < a.count; j += blockDim.x, walk.next(a)) {
            const u64 at = walk.at(a, s);
            A g = widen(go[at]);
            if (weighted) g *= w[(at / a.param_div) % a.param_mod];
            const A xhat = (widen(x[at]) - m) * r;
            s1 += (double)g;
            s2 += (double)g * (double)xhat;
        }
        block_sum2(s1, s2);
        if (threadIdx.x == 0) {
            sum_g[s] = (A)s1;
            sum_gx[s] = (A)s2;
        }
    }
}

template <typename T>
__device__ __forceinline__ void backward_dx_impl(
    const T* __restrict__ go, const T* __restrict__ x, const NormArgs& a,
    const typename Acc<T>::type* __restrict__ mean, const typename Acc<T>::type* __restrict__ rstd,
    const typename Acc<T>::type* __restrict__ w, const typename Acc<T>::type* __restrict__ sum_g,
    const typename Acc<T>::type* __restrict__ sum_gx, T* __restrict__ dx) {
    typedef typename Acc<T>::type A;
    const A inv_count = (A)(1.0 / (double)a.count);
    GRID_STRIDE(i, a.total) {
        const u64 s = (i / a.stat_div) % a.stat_mod, p = (i / a.param_div) % a.param_mod;
        const A wp = a.has_w ? w[p] : (A)1;
        const A g = widen(go[i]) * wp;
        A v;
        if (a.train) {
            const A xhat = (widen(x[i]) - mean[s]) * rstd[s];
            const A outer = a.sums_weighted ? (A)1 : wp;
            v = rstd[s] * (g - outer * (sum_g[s] + xhat * sum_gx[s]) * inv_count);
        } else {
            v = g * rstd[s];
        }
        store(&dx[i], v);
    }
}

template <typename T>
__device__ __forceinline__ void layer_param_grads_impl(
    const T* __restrict__ go, const T* __restrict__ x, const NormArgs& a,
    const typename Acc<T>::type* __restrict__ mean, const typename Acc<T>::type* __restrict__ rstd,
    typename Acc<T>::type* __restrict__ dw, typename Acc<T>::type* __restrict__ db) {
    typedef typename Acc<T>::type A;
    const u64 cols = a.param_mod;
    GRID_STRIDE(j, cols) {
        double sw = 0.0, sb = 0.0;
        for (u64 r = 0; r < a.n_stats; ++r) {
            const u64 at = r * cols + j;
            const A g = widen(go[at]);
            const A xhat = (widen(x[at]) - mean[r]) * rstd[r];
            sw += (double)g * (double)xhat;
            sb += (double)g;
        }
        dw[j] = (A)sw;
        db[j] = (A)sb;
    }
}

#define KILN_NORM(NAME, T, A)                                                                  \
    extern "C" __global__ void kiln_norm_stats_##NAME(const T* __restrict__ x, NormArgs a,      \
                                                      A* __restrict__ mean, A* __restrict__ var, \
                                                      A* __restrict__ rstd) {                   \
        stats_impl<T>(x, a, mean, var, rstd);                                                   \
    }                                                                                          \
    extern "C" __global__ void kiln_norm_apply_##NAME(                                         \
        const T* __restrict__ x, NormArgs a, const A* __restrict__ mean,                        \
        const A* __restrict__ rstd, const A* __restrict__ w, const A* __restrict__ b,           \
        T* __restrict__ y) {                                                                   \
        apply_impl<T>(x, a, mean, rstd, w, b, y);                                               \
    }                                                                                          \
    extern "C" __global__ void kiln_norm_backward_sums_##NAME(                                 \
        const T* __restrict__ go, const T* __restrict__ x, NormArgs a,                          \
        const A* __restrict__ mean, const A* __restrict__ rstd, const A* __restrict__ w,        \
        A* __restrict__ sum_g, A* __restrict__ sum_gx) {                                        \
        backward_sums_impl<T>(go, x, a, mean, rstd, w, sum_g, sum_gx);                          \
    }                                                                                          \
    extern "C" __global__ void kiln_norm_backward_dx_##NAME(                                   \
        const T* __restrict__ go, const T* __restrict__ x, NormArgs a,                          \
        const A* __restrict__ mean, const A* __restrict__ rstd, const A* __restrict__ w,        \
        const A* __restrict__ sum_g, const A* __restrict__ sum_gx, T* __restrict__ dx) {        \
        backward_dx_impl<T>(go, x, a, mean, rstd, w, sum_g, sum_gx, dx);                        \
    }                                                                                          \
    extern "C" __global__ void kiln_layer_norm_param_grads_##NAME(                             \
        const T* __restrict__ go, const T* __restrict__ x, NormArgs a,                          \
        const A* __restrict__ mean, const A* __restrict__ rstd, A* __restrict__ dw,             \
        A* __restrict__ db) {                                                                  \
        layer_param_grads_impl<T>(go, x, a, mean, rstd, dw, db);                                \
    }

KILN_NORM(f32, float, float)
KILN_NORM(f64, double, double)
KILN_NORM(f16, __half, float)
KILN_NORM(bf16, __nv_bfloat16, float)
