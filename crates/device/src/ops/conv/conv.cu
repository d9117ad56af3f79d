// im2col / col2im for conv2d on CUDA (launched from cuda.rs, which does the GEMMs on cuBLAS;
// compiled at first use by NVRTC and checked for sm_80/sm_90 by `cargo xtask kernels`).
//
//   kiln_im2col_<t>(const T* x, ConvArgs a, T* cols, u64 total)
//       cols[n][c*kH*kW + ki*kW + kj][oh*W_out + ow] = x[n][c][ih][iw] (0 outside the input),
//       ih = oh*stride_h - pad_h + ki*dil_h, iw likewise; x is contiguous [N, C, H, W],
//       cols contiguous [N, C*kH*kW, H_out*W_out]; one thread per cols element.
//   kiln_im2col_t_<t>(const T* x, ConvArgs a, T* cols_t, u64 total)
//       the same values with the batch and row axes swapped: cols_t contiguous
//       [C*kH*kW, N, H_out*W_out], the operand of the weight gradient's GEMM, written directly
//       instead of transposed from the columns (which would hold both at once).
//   kiln_col2im_<t>(const T* cols, ConvArgs a, T* dx, u64 total)
//       the adjoint: dx[n][c][h][w] = sum of every cols element im2col read from (n, c, h, w).
//       One thread per dx element gathers its (at most kH*kW) taps in a fixed order, so there
//       are no atomics and the result is deterministic.
// t: f32 f64 f16 bf16. im2col only moves values (exact in every dtype); col2im adds its taps in
// an f32 register for f32/f16/bf16 (double for f64) and rounds once to T. Grid-stride, 64-bit
// indices.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "kiln_common.cuh"
#include "kiln_float.cuh"

// Must match `ConvArgs` in cuda.rs field for field.
struct ConvArgs {
    u64 n, c, h, w;
    u64 kh, kw, oh, ow;
    u64 sh, sw, ph, pw, dh, dw;
};

// BATCH_INNER: the batch axis sits between the rows and the positions ([rows, N, L]).
template <typename T, bool BATCH_INNER>
__device__ __forceinline__ void im2col_impl(const T* __restrict__ x, const ConvArgs& a,
                                            T* __restrict__ cols, u64 total) {
    GRID_STRIDE(i, total) {
        u64 r = i;
        const u64 ow = r % a.ow; r /= a.ow;
        const u64 oh = r % a.oh; r /= a.oh;
        u64 n = 0;
        if (BATCH_INNER) { n = r % a.n; r /= a.n; }
        const u64 kj = r % a.kw; r /= a.kw;
        const u64 ki = r % a.kh; r /= a.kh;
        const u64 c = r % a.c;
        if (!BATCH_INNER) { n = r / a.c; }
        const i64 ih = (i64)(oh * a.sh + ki * a.dh) - (i64)a.ph;
        const i64 iw = (i64)(ow * a.sw + kj * a.dw) - (i64)a.pw;
        if (ih >= 0 && ih < (i64)a.h && iw >= 0 && iw < (i64)a.w) {
            cols[i] = x[((n * a.c + c) * a.h + (u64)ih) * a.w + (u64)iw];
        } else {
            store(&cols[i], (typename Acc<T>::type)0);
        }
    }
}

template <typename T>
__device__ __forceinline__ void col2im_impl(const T* __restrict__ cols, const ConvArgs& a,
                                            T* __restrict__ dx, u64 total) {
    const u64 l = a.oh * a.ow;
    GRID_STRIDE(i, total) {
        u64 r = i;
        const u64 w = r % a.w; r /= a.w;
        const u64 h = r % a.h; r /= a.h;
        const u64 c = r % a.c;
        const u64 n = r / a.c;
        typename Acc<T>::type acc = 0;
        for (u64 ki = 0; ki < a.kh; ++ki) {
            // oh * sh = h + ph - ki * dh must be a non-negative multiple of sh below oh * sh
            const i64 th = (i64)(h + a.ph) - (i64)(ki * a.dh);
            if (th < 0 || th % (i64)a.sh != 0) continue;
            const u64 oh = (u64)th / a.sh;
            if (oh >= a.oh) continue;
            for (u64 kj = 0; kj < a.kw; ++kj) {
                const i64 tw = (i64)(w + a.pw) - (i64)(kj * a.dw);
                if (tw < 0 || tw % (i64)a.sw != 0) continue;
                const u64 ow = (u64)tw / a.sw;
                if (ow >= a.ow) continue;
                const u64 row = (c * a.kh + ki) * a.kw + kj;
                acc += widen(cols[(n * a.c * a.kh * a.kw + row) * l + oh * a.ow + ow]);
            }
        }
        store(&dx[i], acc);
    }
}

#define KILN_CONV(NAME, T)                                                                     \
    extern "C" __global__ void kiln_im2col_##NAME(const T* __restrict__ x, ConvArgs a,         \
                                                  T* __restrict__ cols, u64 total) {           \
        im2col_impl<T, false>(x, a, cols, total);                                               \
    }                                                                                          \
    extern "C" __global__ void kiln_im2col_t_##NAME(const T* __restrict__ x, ConvArgs a,       \
                                                    T* __restrict__ cols, u64 total) {         \
        im2col_impl<T, true>(x, a, cols, total);                                                \
    }                                                                                          \
    extern "C" __global__ void kiln_col2im_##NAME(const T* __restrict__ cols, ConvArgs a,       \
                                                  T* __restrict__ dx, u64 total) {             \
        col2im_impl<T>(cols, a, dx, total);                                                     \
    }

KILN_CONV(f32, float)
KILN_CONV(f64, double)
KILN_CONV(f16, __half)
KILN_CONV(bf16, __nv_bfloat16)
