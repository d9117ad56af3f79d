// Indexing kernels: embedding, index_select, gather (one "take" kernel) and their backward /
// scatter / scatter_add (one "put" kernel). Launched from cuda.rs; compiled at first use by
// NVRTC and checked for sm_80/sm_90 by `cargo xtask kernels`.
//
// Index values are checked by the deferred check of cuda/deferred.cu, queued before these
// kernels without waiting for its verdict, so these kernels must be safe on any index: a take
// writes 0 (all-zero bytes, whatever the dtype) for an index outside [0, size), a put skips it.
// The check reports the bad index at the next synchronisation (or at the op in eager mode).
//
//   kiln_take_b<bytes>(const T* src, StridedArgs src_view, const i64* idx, StridedArgs idx_view,
//                      unsigned dim, u64 size, T* out, u64 n)
//       out[i] = src at the coordinates c(i) of the output shape, with c[dim] replaced by
//       idx[idx_view(i)], or 0 when that index is outside [0, size) (size: the source's extent
//       along dim). `src_view` has the output's rank (its shape is the output shape; only its
//       strides and offset are read). `idx_view` maps an output position to its index:
//       gather passes the index tensor's contiguous strides (same shape as the output);
//       index_select / embedding pass stride 1 at `dim` and 0 elsewhere.
//   kiln_put_<t>(T* dst, StridedArgs dst_view, const T* src, StridedArgs src_view,
//                const i64* idx, StridedArgs idx_view, unsigned dim, u64 n, int has_skip,
//                i64 skip)
//       for every position i of the iteration shape: dst at c(i) with c[dim] = idx[idx_view(i)]
//       gets src[src_view(i)] (written, or added with atomicAdd when accumulate); positions
//       whose index equals `skip` (embedding's padding_idx) or lies outside [0, dst's size along
//       dim) are left out. t: f32 f64 (adds), b1 b2 b4 b8 (plain writes of any dtype).
//
// Coordinates are recomputed per element from the shape (64-bit), no dims are collapsed since
// `dim` must stay addressable. Additions use atomicAdd, so their order (and the last bits of a
// sum with repeated indices) can vary between runs, as in PyTorch's CUDA index_add/scatter_add;
// repeated indices in a plain scatter leave one of the written values (which one is unspecified,
// as in PyTorch). Grid-stride loops over a capped 1-D grid.

#include "kiln_common.cuh"

// Like strided_at, but coordinate `dim` is replaced by `pick`.
__device__ __forceinline__ u64 strided_at_picked(const StridedArgs& l, u64 i, unsigned dim, u64 pick) {
    u64 at = l.offset;
    for (int d = (int)l.ndim - 1; d >= 0; --d) {
        const u64 size = l.shape[d];
        const u64 c = (unsigned)d == dim ? pick : i % size;
        at += c * l.strides[d];
        i /= size;
    }
    return at;
}

#define KILN_TAKE(BYTES, T)                                                                    \
    extern "C" __global__ void kiln_take_b##BYTES(                                             \
        const T* __restrict__ src, StridedArgs src_view, const i64* __restrict__ idx,           \
        StridedArgs idx_view, unsigned dim, u64 size, T* __restrict__ out, u64 n) {             \
        GRID_STRIDE(i, n) {                                                                    \
            const i64 pick = idx[strided_at(idx_view, i)];                                     \
            out[i] = pick < 0 || (u64)pick >= size                                             \
                         ? (T)0                                                                \
                         : src[strided_at_picked(src_view, i, dim, (u64)pick)];                \
        }                                                                                      \
    }

KILN_TAKE(1, unsigned char)
KILN_TAKE(2, unsigned short)
KILN_TAKE(4, unsigned int)
KILN_TAKE(8, u64)

// `src_view` and `idx_view` have the iteration shape; `dst_view` has the destination's shape
// (same rank) and strides, and is addressed at the iteration coordinates with c[dim] = index.
template <typename T, bool ADD>
__device__ __forceinline__ void put_impl(T* dst, const StridedArgs& dst_view, const T* src,
                                         const StridedArgs& src_view, const i64* idx,
                                         const StridedArgs& idx_view, unsigned dim, u64 n,
                                         int has_skip, i64 skip) {
    // dst_view's shape is the destination's; the iteration shape is src_view's.
    const u64 size = dst_view.shape[dim];
    StridedArgs walk = dst_view;
    for (unsigned d = 0; d < walk.ndim; ++d) walk.shape[d] = src_view.shape[d];
    GRID_STRIDE(i, n) {
        const i64 pick = idx[strided_at(idx_view, i)];
        if (pick < 0 || (u64)pick >= size) continue;  // reported by the deferred check
        if (has_skip && pick == skip) continue;
        const u64 at = strided_at_picked(walk, i, dim, (u64)pick);
        const T v = src[strided_at(src_view, i)];
        if constexpr (ADD) {
            atomicAdd(&dst[at], v);
        } else {
            dst[at] = v;
        }
    }
}

#define KILN_PUT(NAME, T, ADD)                                                                 \
    extern "C" __global__ void kiln_put_##NAME(                                                \
        T* __restrict__ dst, StridedArgs dst_view, const T* __restrict__ src,                  \
        StridedArgs src_view, const i64* __restrict__ idx, StridedArgs idx_view, unsigned dim,  \
        u64 n, int has_skip, i64 skip) {                                                        \
        put_impl<T, ADD>(dst, dst_view, src, src_view, idx, idx_view, dim, n, has_skip, skip);  \
    }

KILN_PUT(add_f32, float, true)
KILN_PUT(add_f64, double, true)
KILN_PUT(b1, unsigned char, false)
KILN_PUT(b2, unsigned short, false)
KILN_PUT(b4, unsigned int, false)
KILN_PUT(b8, u64, false)
