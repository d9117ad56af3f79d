// Reductions over any set of dims (launched from cuda.rs with a plan from plan.rs; compiled at
// first use by NVRTC and checked for sm_80/sm_90 by `cargo xtask kernels`).
//
//   pass 1:
//   kiln_reduce_sum_<t>(const T* x, StridedArgs kept, StridedArgs red, O* out, S* partial,
//                       u64 n_out, u64 r, u64 splits, u64 chunk, unsigned access)
//       t: f32 f64 f16 bf16 (O = T, S = SumF: double), i64 u8 bool (O = i64, S = SumI: i64)
//   kiln_reduce_extreme_<t>(const T* x, StridedArgs kept, StridedArgs red, T* out, i64* idx,
//                           Extreme* partial, u64 n_out, u64 r, u64 splits, u64 chunk,
//                           unsigned access, int largest, int want_index)      t: every dtype
//   pass 2 (only when splits > 1):
//   kiln_reduce_sum_combine_<o>(const S* partial, O* out, u64 n_out, u64 splits)
//       o: f32 f64 f16 bf16 (from SumF), i64 (from SumI)
//   kiln_reduce_extreme_combine_<t>(const Extreme* partial, T* out, i64* idx, u64 n_out,
//                                   u64 splits, int largest, int want_index)
//
// The launcher permutes the input so the kept dims come first: `kept` walks the n_out outputs
// (its offset is the view's offset) and `red` the r reduced elements of one output (offset 0).
//
// Groups of up to 1024 elements take a warp each: blocks of 32 x 8, warp threadIdx.y folds
// output blockIdx.x * 8 + threadIdx.y (grid-stride) and reduces with shuffles alone.
// Longer groups take 1-D blocks (256 threads). Each output's group is cut into `splits` chunks
// of `chunk` elements (splits = 1, chunk = r when there are enough outputs to fill the device:
// see plan.rs); work item w = o * splits + c is one block (grid-stride over work items, so any
// count fits a capped 1-D grid). Each thread folds its elements of the chunk, then the block
// combines the per-thread states with warp shuffles and one shared-memory step. With one
// chunk, thread 0 writes the output; otherwise it writes the chunk's state to `partial[w]` (a
// scratch buffer) and pass 2 folds each output's partials, chunk order fixed, the same way.
// The tree depends only on the plan, which depends only on the shapes, the read and the SM
// count, so results are deterministic run to run (no atomics).
//
// `access` (ACCESS_* below, chosen on the host) is how a chunk is read: through the strides
// (32-bit index math when r < 2^32), as a unit-stride row x[base + j] (several independent
// loads in flight per thread), or as 16-byte vectors when every row start is 16-byte aligned
// (chunks are multiples of 16 elements, so every chunk starts aligned too; the tail past the
// last whole vector is read element-wise). ACCESS_OUTER is the reduced dim outside unit-stride
// outputs (dim 0 of a [rows, cols] tensor, a bias gradient): there a 256-thread 2-D block takes
// a tile of up to 32 neighbouring outputs (blockDim.x columns by blockDim.y row lanes, both
// powers of two) so every warp reads contiguous row segments, and a work item is (tile, chunk
// of rows); the partials keep the same per-output layout.
//
// Pass-1 kernels declare __launch_bounds__(256, 4): four blocks fit on an SM (plan.rs's
// BLOCKS_PER_SM relies on it, so a split is one wave).
//
// Sums accumulate in double (the CPU backend's f64 accumulator; halves and f32 included),
// integer sums in wrapping i64. Max/min/argmax carry (value, index) pairs (the value as float
// for f32/f16/bf16, which is exact and compares at the f32 rate; double for f64; i64 for the
// integer dtypes), the index counted in the whole group, and combine them by value, NaN first
// (NaN-propagating as on the CPU), ties and NaNs to the lower index. That choice is a total
// order on the pairs, so it picks the same pair however the elements are grouped: argmax
// returns the first maximum (or first NaN) whichever thread, block or chunk saw it.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "kiln_common.cuh"

// True when indices below n take strided_at32.
__device__ __forceinline__ bool fits32(u64 n) { return n <= 0xFFFFFFFFull; }

// ---- value <-> double / integer keys ----
__device__ __forceinline__ double key(float v) { return (double)v; }
__device__ __forceinline__ double key(double v) { return v; }
__device__ __forceinline__ double key(__half v) { return (double)__half2float(v); }
__device__ __forceinline__ double key(__nv_bfloat16 v) { return (double)__bfloat162float(v); }
__device__ __forceinline__ i64 key(i64 v) { return v; }
__device__ __forceinline__ i64 key(unsigned char v) { return (i64)v; }

// Back from a double accumulator, as `Element::from_f64` (halves through f32: see copy.cu).
__device__ __forceinline__ void store(float* p, double v) { *p = __double2float_rn(v); }
__device__ __forceinline__ void store(double* p, double v) { *p = v; }
__device__ __forceinline__ void store(__half* p, double v) { *p = __float2half_rn(__double2float_rn(v)); }
__device__ __forceinline__ void store(__nv_bfloat16* p, double v) {
    const u64 bits = (u64)__double_as_longlong(v);
    const double cut = ((bits & 0x7FF0000000000000ULL) == 0x7FF0000000000000ULL)
                           ? v
                           : __longlong_as_double((i64)(bits & 0xFFFFFFFF00000000ULL));
    *p = __double2bfloat16(cut);
}
// Extremes of integers are exact in their own type.
__device__ __forceinline__ void store(i64* p, i64 v) { *p = v; }
__device__ __forceinline__ void store(unsigned char* p, i64 v) { *p = (unsigned char)v; }
// An empty max over an integer type is from_f64(NaN) = 0 on the CPU.
__device__ __forceinline__ void store(i64* p, double) { *p = 0; }
__device__ __forceinline__ void store(unsigned char* p, double) { *p = 0; }

__device__ __forceinline__ bool is_nan(float v) { return v != v; }
__device__ __forceinline__ bool is_nan(double v) { return v != v; }
__device__ __forceinline__ bool is_nan(i64) { return false; }

// ---- states and their block-wide combination ----
struct SumF {
    double v;
    __device__ static SumF identity() { SumF s; s.v = 0.0; return s; }
    __device__ static SumF combine(SumF a, SumF b) { a.v += b.v; return a; }
    __device__ static SumF shfl(SumF s, int o) { s.v = __shfl_down_sync(0xffffffffu, s.v, o); return s; }
    __device__ void at(u64) {}
};

struct SumI {
    i64 v;
    __device__ static SumI identity() { SumI s; s.v = 0; return s; }
    __device__ static SumI combine(SumI a, SumI b) { a.v = (i64)((u64)a.v + (u64)b.v); return a; }
    __device__ static SumI shfl(SumI s, int o) { s.v = __shfl_down_sync(0xffffffffu, s.v, o); return s; }
    __device__ void at(u64) {}
};

template <typename K> struct Extreme {
    K v;
    u64 idx;
    int valid;
    int largest;
    __device__ static Extreme identity_for(int largest) {
        Extreme s;
        s.v = (K)0;
        s.idx = 0;
        s.valid = 0;
        s.largest = largest;
        return s;
    }
    __device__ static Extreme combine(Extreme a, Extreme b) {
        if (!a.valid) return b;
        if (!b.valid) return a;
        const bool an = is_nan(a.v), bn = is_nan(b.v);
        if (an || bn) {
            if (an && bn) return a.idx <= b.idx ? a : b;
            return an ? a : b;
        }
        if (a.v == b.v) return a.idx <= b.idx ? a : b;
        const bool a_wins = a.largest ? (a.v > b.v) : (a.v < b.v);
        return a_wins ? a : b;
    }
    __device__ static Extreme shfl(Extreme s, int o) {
        s.v = __shfl_down_sync(0xffffffffu, s.v, o);
        s.idx = __shfl_down_sync(0xffffffffu, s.idx, o);
        s.valid = __shfl_down_sync(0xffffffffu, s.valid, o);
        return s; // `largest` is the same in every lane
    }
    __device__ void at(u64 j) {
        idx = j;
        valid = 1;
    }
};

// The scratch layout of a partial extreme state: cuda.rs allocates this many bytes per chunk.
static_assert(sizeof(Extreme<float>) == 24, "EXTREME_STATE_BYTES in cuda.rs");
static_assert(sizeof(Extreme<double>) == 24, "EXTREME_STATE_BYTES in cuda.rs");
static_assert(sizeof(Extreme<i64>) == 24, "EXTREME_STATE_BYTES in cuda.rs");

template <typename S> __device__ __forceinline__ S warp_reduce(S s) {
    for (int o = 16; o > 0; o >>= 1) {
        s = S::combine(s, S::shfl(s, o));
    }
    return s;
}

// The block's combined state, valid in thread 0. Every thread of the block must call it.
template <typename S> __device__ __forceinline__ S block_reduce(S s, S identity) {
    __shared__ S warp_states[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
    s = warp_reduce(s);
    if (lane == 0) warp_states[warp] = s;
    __syncthreads();
    if (warp == 0) {
        s = lane < warps ? warp_states[lane] : identity;
        s = warp_reduce(s);
    }
    __syncthreads(); // warp_states is reused by the next output of this block
    return s;
}

#define ACCESS_STRIDED 0
#define ACCESS_CONTIGUOUS 1
#define ACCESS_VECTOR 2
#define ACCESS_OUTER 3

// 16 bytes of T, loaded with one vector instruction.
template <typename T> struct alignas(16) Pack {
    T v[16 / sizeof(T)];
};

// Element j of the group as a state (value, and index for extremes).
template <typename S, typename T> __device__ __forceinline__ S element(S id, T v, u64 j) {
    S e = id;
    e.v = (decltype(e.v))key(v); // exact: float keys only hold f32/f16/bf16 values
    e.at(j);
    return e;
}

// The fold of elements [lo, hi) of the r-element group starting at x[base] by this thread (its
// share: j = lo + threadIdx.x, then blockDim.x apart, or whole vectors the same way).
template <typename T, typename S>
__device__ __forceinline__ S fold_chunk(const T* __restrict__ x, u64 base, const StridedArgs& red,
                                        u64 r, u64 lo, u64 hi, unsigned access, S id) {
    S s = id;
    const u64 step = blockDim.x;
    if (access == ACCESS_VECTOR) {
        // U 16-byte loads in flight per thread (two for bytes: 16 lanes each, registers bound)
        constexpr int V = 16 / sizeof(T), U = V >= 16 ? 2 : 4;
        const Pack<T>* p = reinterpret_cast<const Pack<T>*>(x + base + lo);
        const u64 packs = (hi - lo) / V;
        u64 k = threadIdx.x;
        for (; k + (U - 1) * step < packs; k += U * step) {
            Pack<T> a[U];
#pragma unroll
            for (int u = 0; u < U; ++u) a[u] = p[k + u * step];
#pragma unroll
            for (int u = 0; u < U; ++u) {
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    s = S::combine(s, element(id, a[u].v[e], lo + (k + u * step) * V + e));
                }
            }
        }
        for (; k < packs; k += step) {
            const Pack<T> a = p[k];
#pragma unroll
            for (int e = 0; e < V; ++e) s = S::combine(s, element(id, a.v[e], lo + k * V + e));
        }
        for (u64 j = lo + packs * V + threadIdx.x; j < hi; j += step) {
            s = S::combine(s, element(id, x[base + j], j));
        }
    } else if (access == ACCESS_CONTIGUOUS) {
        u64 j = lo + threadIdx.x;
        for (; j + 3 * step < hi; j += 4 * step) { // four loads in flight
            const T a0 = x[base + j], a1 = x[base + j + step];
            const T a2 = x[base + j + 2 * step], a3 = x[base + j + 3 * step];
            s = S::combine(s, element(id, a0, j));
            s = S::combine(s, element(id, a1, j + step));
            s = S::combine(s, element(id, a2, j + 2 * step));
            s = S::combine(s, element(id, a3, j + 3 * step));
        }
        for (; j < hi; j += step) s = S::combine(s, element(id, x[base + j], j));
    } else if (fits32(r)) { // every size of `red` is at most r
        for (u64 j = lo + threadIdx.x; j < hi; j += step) {
            s = S::combine(s, element(id, x[base + strided_at32(red, (unsigned)j)], j));
        }
    } else {
        for (u64 j = lo + threadIdx.x; j < hi; j += step) {
            s = S::combine(s, element(id, x[base + strided_at(red, j)], j));
        }
    }
    return s;
}

// Pass 1 of ACCESS_OUTER: output o (unit stride: x[kept.offset + o]) sums rows j of stride
// red.strides[0]. The block is blockDim.x columns by blockDim.y row lanes; work item
// w = tile * splits + c takes columns tile * blockDim.x .. and rows [c * chunk, ..). A warp
// reads whole row segments (coalesced); each thread folds its column over rows y, y +
// blockDim.y, ..., then the row lanes combine in shared memory by halving (a fixed tree).
template <typename T, typename S, typename Finish>
__device__ __forceinline__ void pass1_outer(const T* __restrict__ x, const StridedArgs& kept,
                                            const StridedArgs& red, S* __restrict__ partial,
                                            u64 n_out, u64 r, u64 splits, u64 chunk, S id,
                                            Finish finish) {
    __shared__ S lanes[256];
    const u64 tx = blockDim.x, ty = blockDim.y, row_stride = red.strides[0];
    const unsigned me = threadIdx.y * blockDim.x + threadIdx.x;
    const u64 work = (n_out + tx - 1) / tx * splits;
    for (u64 w = blockIdx.x; w < work; w += gridDim.x) {
        const u64 tile = w / splits, c = w - tile * splits;
        const u64 o = tile * tx + threadIdx.x;
        const u64 lo = c * chunk, hi = min(r, lo + chunk);
        S s = id;
        if (o < n_out) {
            const T* col = x + kept.offset + o;
            u64 j = lo + threadIdx.y;
            for (; j + 3 * ty < hi; j += 4 * ty) { // four loads in flight
                const T a0 = col[j * row_stride], a1 = col[(j + ty) * row_stride];
                const T a2 = col[(j + 2 * ty) * row_stride], a3 = col[(j + 3 * ty) * row_stride];
                s = S::combine(s, element(id, a0, j));
                s = S::combine(s, element(id, a1, j + ty));
                s = S::combine(s, element(id, a2, j + 2 * ty));
                s = S::combine(s, element(id, a3, j + 3 * ty));
            }
            for (; j < hi; j += ty) s = S::combine(s, element(id, col[j * row_stride], j));
        }
        lanes[me] = s;
        __syncthreads();
        for (u64 h = ty / 2; h > 0; h /= 2) {
            if (threadIdx.y < h) {
                lanes[me] = S::combine(lanes[me], lanes[me + h * tx]);
            }
            __syncthreads();
        }
        if (threadIdx.y == 0 && o < n_out) {
            if (splits == 1) {
                finish(o, lanes[me]);
            } else {
                partial[o * splits + c] = lanes[me];
            }
        }
        __syncthreads(); // lanes is reused by the next work item
    }
}

// Pass 1: every (output, chunk) work item to its block state; `finish(o, s)` stores an output
// when the group is one chunk, else the state goes to partial[w].
template <typename T, typename S, typename Finish>
__device__ __forceinline__ void pass1(const T* __restrict__ x, const StridedArgs& kept,
                                      const StridedArgs& red, S* __restrict__ partial, u64 n_out,
                                      u64 r, u64 splits, u64 chunk, unsigned access, S id,
                                      Finish finish) {
    if (access == ACCESS_OUTER) {
        pass1_outer(x, kept, red, partial, n_out, r, splits, chunk, id, finish);
        return;
    }
    if (blockDim.y > 1) { // short groups: one warp per output, no split, no barrier
        const u64 warps = (u64)gridDim.x * blockDim.y;
        for (u64 o = (u64)blockIdx.x * blockDim.y + threadIdx.y; o < n_out; o += warps) {
            S s = fold_chunk(x, strided_at(kept, o), red, r, 0, r, access, id);
            s = warp_reduce(s);
            if (threadIdx.x == 0) finish(o, s);
        }
        return;
    }
    const u64 work = n_out * splits;
    for (u64 w = blockIdx.x; w < work; w += gridDim.x) {
        const u64 o = w / splits, c = w - o * splits;
        const u64 lo = c * chunk, hi = min(r, lo + chunk);
        S s = fold_chunk(x, strided_at(kept, o), red, r, lo, hi, access, id);
        s = block_reduce(s, id);
        if (threadIdx.x == 0) {
            if (splits == 1) {
                finish(o, s);
            } else {
                partial[w] = s;
            }
        }
    }
}

// Pass 2: output o folds partial[o * splits .. (o + 1) * splits) in a fixed tree.
template <typename S, typename Finish>
__device__ __forceinline__ void pass2(const S* __restrict__ partial, u64 n_out, u64 splits, S id,
                                      Finish finish) {
    for (u64 o = blockIdx.x; o < n_out; o += gridDim.x) {
        S s = id;
        for (u64 k = threadIdx.x; k < splits; k += blockDim.x) {
            s = S::combine(s, partial[o * splits + k]);
        }
        s = block_reduce(s, id);
        if (threadIdx.x == 0) finish(o, s);
    }
}

#define KILN_SUM(NAME, T, S, O)                                                                \
    extern "C" __global__ void __launch_bounds__(256, 4) kiln_reduce_sum_##NAME(               \
        const T* __restrict__ x, StridedArgs kept, StridedArgs red, O* __restrict__ out,         \
        S* __restrict__ partial, u64 n_out, u64 r, u64 splits, u64 chunk, unsigned access) {   \
        pass1<T, S>(x, kept, red, partial, n_out, r, splits, chunk, access, S::identity(),      \
                    [&](u64 o, S s) { store(&out[o], s.v); });                                 \
    }

KILN_SUM(f32, float, SumF, float)
KILN_SUM(f64, double, SumF, double)
KILN_SUM(f16, __half, SumF, __half)
KILN_SUM(bf16, __nv_bfloat16, SumF, __nv_bfloat16)
KILN_SUM(i64, i64, SumI, i64)
KILN_SUM(u8, unsigned char, SumI, i64)
KILN_SUM(bool, unsigned char, SumI, i64)

#define KILN_SUM_COMBINE(NAME, S, O)                                                           \
    extern "C" __global__ void kiln_reduce_sum_combine_##NAME(                                 \
        const S* __restrict__ partial, O* __restrict__ out, u64 n_out, u64 splits) {            \
        pass2<S>(partial, n_out, splits, S::identity(),                                        \
                 [&](u64 o, S s) { store(&out[o], s.v); });                                    \
    }

KILN_SUM_COMBINE(f32, SumF, float)
KILN_SUM_COMBINE(f64, SumF, double)
KILN_SUM_COMBINE(f16, SumF, __half)
KILN_SUM_COMBINE(bf16, SumF, __nv_bfloat16)
KILN_SUM_COMBINE(i64, SumI, i64)

// Writes output o of an extreme: the index, or the value (NaN for an empty group).
template <typename T, typename S>
__device__ __forceinline__ void finish_extreme(T* __restrict__ out, i64* __restrict__ idx, u64 o,
                                               const S& s, int want_index) {
    if (want_index) {
        idx[o] = s.valid ? (i64)s.idx : 0;
    } else if (s.valid) {
        store(&out[o], s.v);
    } else {
        store(&out[o], __longlong_as_double(0x7FF8000000000000LL)); // empty: NaN
    }
}

#define KILN_EXTREME(NAME, T, K)                                                                \
    extern "C" __global__ void __launch_bounds__(256, 4) kiln_reduce_extreme_##NAME(            \
        const T* __restrict__ x, StridedArgs kept, StridedArgs red, T* __restrict__ out,         \
        i64* __restrict__ idx, Extreme<K>* __restrict__ partial, u64 n_out, u64 r, u64 splits,   \
        u64 chunk, unsigned access, int largest, int want_index) {                               \
        pass1<T, Extreme<K>>(x, kept, red, partial, n_out, r, splits, chunk, access,             \
                             Extreme<K>::identity_for(largest), [&](u64 o, Extreme<K> s) {       \
                                 finish_extreme(out, idx, o, s, want_index);                    \
                             });                                                                \
    }                                                                                           \
    extern "C" __global__ void kiln_reduce_extreme_combine_##NAME(                              \
        const Extreme<K>* __restrict__ partial, T* __restrict__ out, i64* __restrict__ idx,     \
        u64 n_out, u64 splits, int largest, int want_index) {                                   \
        pass2<Extreme<K>>(partial, n_out, splits, Extreme<K>::identity_for(largest),            \
                          [&](u64 o, Extreme<K> s) {                                            \
                              finish_extreme(out, idx, o, s, want_index);                      \
                          });                                                                   \
    }

KILN_EXTREME(f32, float, float)
KILN_EXTREME(f64, double, double)
KILN_EXTREME(f16, __half, float)
KILN_EXTREME(bf16, __nv_bfloat16, float)
KILN_EXTREME(i64, i64, i64)
KILN_EXTREME(u8, unsigned char, i64)
KILN_EXTREME(bool, unsigned char, i64)
