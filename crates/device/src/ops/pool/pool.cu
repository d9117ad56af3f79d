// 2-D pooling kernels (launched from cuda.rs; compiled at first use by NVRTC and checked for
// sm_80/sm_90 by `cargo xtask kernels`). Input/gradients contiguous [N, C, H, W], outputs
// [N, C, H_out, W_out]; `planes` = N * C.
//
//   kiln_max_pool_<t>(const T* x, PoolArgs a, T* out, i64* idx, u64 total)
//       one thread per output: the window's maximum and its position h * W + w in the plane.
//       Taps are visited row by row like the CPU kernel; a larger value or any NaN replaces
//       the best, so NaN propagates and the first maximum wins a tie.
//   kiln_avg_pool_<t>(const T* x, PoolArgs a, T* out, u64 total)
//       window clipped to the input; divisor: divisor_override, or the window including
//       padding (count_include_pad), or the clipped window; an empty window gives 0.
//   kiln_adaptive_avg_pool_<t>(const T* x, PoolArgs a, T* out, u64 total)
//       rows [floor(o*H/Ho), ceil((o+1)*H/Ho)), likewise columns.
//   kiln_max_pool_backward_<t>(const T* g, const i64* idx, PoolArgs a, T* gin, u64 total)
//   kiln_avg_pool_backward_<t> / kiln_adaptive_avg_pool_backward_<t>(const T* g, PoolArgs a,
//                                                                       T* gin, u64 total)
//       f32 f64: one thread per output gradient (`total` outputs) adds its share into the
//       zeroed input gradient with atomicAdd (windows overlap); the addition order is not fixed.
//       f16 bf16: one thread per input gradient element (`total` inputs) gathers the shares of
//       every window that covers it (max pooling: whose index names it) in a fixed order, sums
//       them in an f32 register and rounds once, so no 16-bit atomics round at every addition,
//       the result is deterministic and the gradient needs no zero fill.
// t: f32 f64 f16 bf16. Values are read as T and computed in Acc<T> (f32 for the 16-bit types,
// T otherwise); each output is rounded to T once. Grid-stride, 64-bit indices.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "kiln_common.cuh"
#include "kiln_float.cuh"

// Must match `PoolArgs` in cuda.rs field for field.
struct PoolArgs {
    u64 planes, ih, iw, oh, ow;
    u64 kh, kw, sh, sw, ph, pw, dh, dw;
    u64 count_include_pad, divisor_override; // divisor_override 0: none
};

template <typename T>
__device__ __forceinline__ void max_impl(const T* __restrict__ x, const PoolArgs& a,
                                         T* __restrict__ out, i64* __restrict__ idx, u64 total) {
    typedef typename Acc<T>::type A;
    const A neg_inf = (A)__longlong_as_double(0xfff0000000000000LL);
    GRID_STRIDE(i, total) {
        const u64 ow = i % a.ow, oh = (i / a.ow) % a.oh, plane = i / (a.ow * a.oh);
        const T* src = x + plane * a.ih * a.iw;
        const i64 hs = (i64)(oh * a.sh) - (i64)a.ph, ws = (i64)(ow * a.sw) - (i64)a.pw;
        A best = neg_inf;
        i64 best_at = -1;
        for (u64 th = 0; th < a.kh; ++th) {
            const i64 h = hs + (i64)(th * a.dh);
            if (h < 0 || h >= (i64)a.ih) continue;
            for (u64 tw = 0; tw < a.kw; ++tw) {
                const i64 w = ws + (i64)(tw * a.dw);
                if (w < 0 || w >= (i64)a.iw) continue;
                const i64 at = h * (i64)a.iw + w;
                const A v = widen(src[at]);
                if (best_at < 0) best_at = at; // the first tap in the input
                if (v > best || v != v) {
                    best = v;
                    best_at = at;
                }
            }
        }
        store(&out[i], best); // exact: best is a widened input value
        idx[i] = best_at < 0 ? 0 : best_at; // the geometry rules out empty windows
    }
}

// The clipped window of output (oh, ow) and its divisor, as the CPU's avg_window.
struct Window {
    i64 h0, h1, w0, w1;
    double divisor;
};

__device__ __forceinline__ Window avg_window(const PoolArgs& a, u64 oh, u64 ow) {
    Window win;
    i64 padded[2];
    const u64 o[2] = {oh, ow}, s[2] = {a.sh, a.sw}, p[2] = {a.ph, a.pw}, k[2] = {a.kh, a.kw};
    const u64 in[2] = {a.ih, a.iw};
    i64 lo[2], hi[2];
    for (int ax = 0; ax < 2; ++ax) {
        const i64 start = (i64)(o[ax] * s[ax]) - (i64)p[ax];
        i64 end = start + (i64)k[ax];
        const i64 limit = (i64)in[ax] + (i64)p[ax];
        if (end > limit) end = limit;
        padded[ax] = end - start;
        const i64 cs = start > 0 ? start : 0;
        i64 ce = end < (i64)in[ax] ? end : (i64)in[ax];
        if (ce < cs) ce = cs;
        lo[ax] = cs;
        hi[ax] = ce;
    }
    win.h0 = lo[0];
    win.h1 = hi[0];
    win.w0 = lo[1];
    win.w1 = hi[1];
    if (a.divisor_override != 0) {
        win.divisor = (double)a.divisor_override;
    } else if (a.count_include_pad) {
        win.divisor = (double)(padded[0] * padded[1]);
    } else {
        win.divisor = (double)((win.h1 - win.h0) * (win.w1 - win.w0));
    }
    return win;
}

__device__ __forceinline__ Window adaptive_window(const PoolArgs& a, u64 oh, u64 ow) {
    Window win;
    win.h0 = (i64)(oh * a.ih / a.oh);
    win.h1 = (i64)(((oh + 1) * a.ih + a.oh - 1) / a.oh);
    win.w0 = (i64)(ow * a.iw / a.ow);
    win.w1 = (i64)(((ow + 1) * a.iw + a.ow - 1) / a.ow);
    win.divisor = (double)((win.h1 - win.h0) * (win.w1 - win.w0));
    return win;
}

template <typename T, bool ADAPTIVE>
__device__ __forceinline__ void avg_impl(const T* __restrict__ x, const PoolArgs& a,
                                         T* __restrict__ out, u64 total) {
    GRID_STRIDE(i, total) {
        const u64 ow = i % a.ow, oh = (i / a.ow) % a.oh, plane = i / (a.ow * a.oh);
        const T* src = x + plane * a.ih * a.iw;
        const Window win = ADAPTIVE ? adaptive_window(a, oh, ow) : avg_window(a, oh, ow);
        typedef typename Acc<T>::type A;
        A sum = 0;
        for (i64 h = win.h0; h < win.h1; ++h) {
            for (i64 w = win.w0; w < win.w1; ++w) sum += widen(src[h * (i64)a.iw + w]);
        }
        const bool empty = win.h0 == win.h1 || win.w0 == win.w1;
        store(&out[i], empty ? (A)0 : sum / (A)win.divisor);
    }
}

template <typename T, bool ADAPTIVE>
__device__ __forceinline__ void avg_backward_impl(const T* __restrict__ g, const PoolArgs& a,
                                                  T* __restrict__ gin, u64 total) {
    GRID_STRIDE(i, total) {
        const u64 ow = i % a.ow, oh = (i / a.ow) % a.oh, plane = i / (a.ow * a.oh);
        T* dst = gin + plane * a.ih * a.iw;
        const Window win = ADAPTIVE ? adaptive_window(a, oh, ow) : avg_window(a, oh, ow);
        if (win.h0 == win.h1 || win.w0 == win.w1) continue;
        const T share = g[i] / (T)win.divisor;
        for (i64 h = win.h0; h < win.h1; ++h) {
            for (i64 w = win.w0; w < win.w1; ++w) atomicAdd(&dst[h * (i64)a.iw + w], share);
        }
    }
}

template <typename T>
__device__ __forceinline__ void max_backward_impl(const T* __restrict__ g, const i64* __restrict__ idx,
                                                  const PoolArgs& a, T* __restrict__ gin, u64 total) {
    GRID_STRIDE(i, total) {
        const u64 plane = i / (a.ow * a.oh);
        atomicAdd(&gin[plane * a.ih * a.iw + (u64)idx[i]], g[i]);
    }
}

// ---- 16-bit backward: one thread per input element gathers (see the top comment) ----

// Calls f(o, tap) for every output o (its index in the plane's H_out x W_out grid) whose window
// tap (th, tw) lands on input (h, w): o_h * stride_h - pad_h + th * dil_h == h, likewise w.
template <typename F>
__device__ __forceinline__ void for_windows_at(const PoolArgs& a, u64 h, u64 w, F f) {
    for (u64 th = 0; th < a.kh; ++th) {
        const i64 t = (i64)(h + a.ph) - (i64)(th * a.dh);
        if (t < 0 || t % (i64)a.sh != 0) continue;
        const u64 oh = (u64)t / a.sh;
        if (oh >= a.oh) continue;
        for (u64 tw = 0; tw < a.kw; ++tw) {
            const i64 s = (i64)(w + a.pw) - (i64)(tw * a.dw);
            if (s < 0 || s % (i64)a.sw != 0) continue;
            const u64 ow = (u64)s / a.sw;
            if (ow >= a.ow) continue;
            f(oh, ow);
        }
    }
}

template <typename T>
__device__ __forceinline__ void max_gather_impl(const T* __restrict__ g, const i64* __restrict__ idx,
                                                const PoolArgs& a, T* __restrict__ gin, u64 total) {
    GRID_STRIDE(i, total) {
        const u64 w = i % a.iw, h = (i / a.iw) % a.ih, plane = i / (a.iw * a.ih);
        const u64 base = plane * a.oh * a.ow;
        const i64 me = (i64)(h * a.iw + w);
        float acc = 0.0f;
        for_windows_at(a, h, w, [&](u64 oh, u64 ow) {
            const u64 o = base + oh * a.ow + ow;
            if (idx[o] == me) acc += widen(g[o]);
        });
        store(&gin[i], acc);
    }
}

template <typename T, bool ADAPTIVE>
__device__ __forceinline__ void avg_gather_impl(const T* __restrict__ g, const PoolArgs& a,
                                                T* __restrict__ gin, u64 total) {
    GRID_STRIDE(i, total) {
        const u64 w = i % a.iw, h = (i / a.iw) % a.ih, plane = i / (a.iw * a.ih);
        const u64 base = plane * a.oh * a.ow;
        float acc = 0.0f;
        if (ADAPTIVE) {
            // windows [floor(o*I/O), ceil((o+1)*I/O)) holding h: o from floor(h*O/I) up
            const u64 oh1 = ((h + 1) * a.oh + a.ih - 1) / a.ih, ow1 = ((w + 1) * a.ow + a.iw - 1) / a.iw;
            for (u64 oh = h * a.oh / a.ih; oh < oh1 && oh < a.oh; ++oh) {
                for (u64 ow = w * a.ow / a.iw; ow < ow1 && ow < a.ow; ++ow) {
                    const Window win = adaptive_window(a, oh, ow);
                    if ((i64)h < win.h0 || (i64)h >= win.h1 || (i64)w < win.w0 || (i64)w >= win.w1)
                        continue;
                    acc += widen(g[base + oh * a.ow + ow]) / (float)win.divisor;
                }
            }
        } else {
            // every window with a tap on (h, w) covers it after clipping (0 <= h < H)
            for_windows_at(a, h, w, [&](u64 oh, u64 ow) {
                const Window win = avg_window(a, oh, ow);
                acc += widen(g[base + oh * a.ow + ow]) / (float)win.divisor;
            });
        }
        store(&gin[i], acc);
    }
}

#define KILN_POOL_FORWARD(NAME, T)                                                             \
    extern "C" __global__ void kiln_max_pool_##NAME(const T* __restrict__ x, PoolArgs a,        \
                                                    T* __restrict__ out, i64* __restrict__ idx, \
                                                    u64 total) {                                \
        max_impl<T>(x, a, out, idx, total);                                                     \
    }                                                                                          \
    extern "C" __global__ void kiln_avg_pool_##NAME(const T* __restrict__ x, PoolArgs a,        \
                                                    T* __restrict__ out, u64 total) {           \
        avg_impl<T, false>(x, a, out, total);                                                   \
    }                                                                                          \
    extern "C" __global__ void kiln_adaptive_avg_pool_##NAME(const T* __restrict__ x,           \
                                                             PoolArgs a, T* __restrict__ out,   \
                                                             u64 total) {                       \
        avg_impl<T, true>(x, a, out, total);                                                    \
    }

// Backward kernels: IMPL_MAX / IMPL_AVG are the atomic (per output) or gather (per input) bodies.
#define KILN_POOL_BACKWARD(NAME, T, IMPL_MAX, IMPL_AVG)                                        \
    extern "C" __global__ void kiln_max_pool_backward_##NAME(                                  \
        const T* __restrict__ g, const i64* __restrict__ idx, PoolArgs a, T* __restrict__ gin,  \
        u64 total) {                                                                           \
        IMPL_MAX<T>(g, idx, a, gin, total);                                                     \
    }                                                                                          \
    extern "C" __global__ void kiln_avg_pool_backward_##NAME(const T* __restrict__ g,           \
                                                             PoolArgs a, T* __restrict__ gin,   \
                                                             u64 total) {                       \
        IMPL_AVG<T, false>(g, a, gin, total);                                                   \
    }                                                                                          \
    extern "C" __global__ void kiln_adaptive_avg_pool_backward_##NAME(                         \
        const T* __restrict__ g, PoolArgs a, T* __restrict__ gin, u64 total) {                  \
        IMPL_AVG<T, true>(g, a, gin, total);                                                    \
    }

KILN_POOL_FORWARD(f32, float)
KILN_POOL_FORWARD(f64, double)
KILN_POOL_FORWARD(f16, __half)
KILN_POOL_FORWARD(bf16, __nv_bfloat16)
KILN_POOL_BACKWARD(f32, float, max_backward_impl, avg_backward_impl)
KILN_POOL_BACKWARD(f64, double, max_backward_impl, avg_backward_impl)
KILN_POOL_BACKWARD(f16, __half, max_gather_impl, avg_gather_impl)
KILN_POOL_BACKWARD(bf16, __nv_bfloat16, max_gather_impl, avg_gather_impl)
