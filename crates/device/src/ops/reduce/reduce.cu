// Reductions over any set of dims (launched from cuda.rs; compiled at first use by NVRTC and
// checked for sm_80/sm_90 by `cargo xtask kernels`).
//
//   kiln_reduce_sum_<t>(const T* x, StridedArgs kept, StridedArgs red, O* out, u64 n_out, u64 r)
//       t: f32 f64 f16 bf16 (O = T, double accumulator), i64 u8 bool (O = i64, wrapping i64 sum)
//   kiln_reduce_extreme_<t>(const T* x, StridedArgs kept, StridedArgs red, T* out, i64* idx,
//                           u64 n_out, u64 r, int largest, int want_index)     t: every dtype
//
// The launcher permutes the input so the kept dims come first: `kept` walks the n_out outputs
// (its offset is the view's offset) and `red` the r reduced elements of one output (offset 0).
// One block per output (grid-stride over outputs, so any n_out fits a capped 1-D grid). Each
// thread folds elements j = tid, tid + blockDim, ... in order, then the block combines the
// per-thread states with warp shuffles and one shared-memory step: a fixed tree, so results are
// deterministic run to run. Sums accumulate in double (the CPU backend's f64 accumulator;
// halves and f32 included), integer sums in i64. Max/min/argmax carry (value, index) pairs and
// combine them by value, NaN first (NaN-propagating as on the CPU), ties and NaNs to the lower
// index, so argmax returns the first maximum regardless of which thread saw it.
// blockDim.x must be a multiple of 32 (the launcher picks 32..256).

#include <cuda_fp16.h>
#include <cuda_bf16.h>

typedef unsigned long long u64;
typedef long long i64;

#define KILN_MAX_DIMS 8

// Must match `StridedArgs` in cuda/launch.rs field for field.
struct StridedArgs {
    u64 offset;
    u64 shape[KILN_MAX_DIMS];
    u64 strides[KILN_MAX_DIMS];
    unsigned int ndim;
    unsigned int pad;
};

__device__ __forceinline__ u64 strided_at(const StridedArgs& l, u64 i) {
    u64 at = l.offset;
    for (int d = (int)l.ndim - 1; d >= 0; --d) {
        const u64 size = l.shape[d];
        at += (i % size) * l.strides[d];
        i /= size;
    }
    return at;
}

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

__device__ __forceinline__ bool is_nan(double v) { return v != v; }
__device__ __forceinline__ bool is_nan(i64) { return false; }

// ---- states and their block-wide combination ----
struct SumF {
    double v;
    __device__ static SumF identity() { SumF s; s.v = 0.0; return s; }
    __device__ static SumF combine(SumF a, SumF b) { a.v += b.v; return a; }
    __device__ static SumF shfl(SumF s, int o) { s.v = __shfl_down_sync(0xffffffffu, s.v, o); return s; }
};

struct SumI {
    i64 v;
    __device__ static SumI identity() { SumI s; s.v = 0; return s; }
    __device__ static SumI combine(SumI a, SumI b) { a.v = (i64)((u64)a.v + (u64)b.v); return a; }
    __device__ static SumI shfl(SumI s, int o) { s.v = __shfl_down_sync(0xffffffffu, s.v, o); return s; }
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
};

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

template <typename T, typename S, typename O>
__device__ __forceinline__ void sum_impl(const T* __restrict__ x, const StridedArgs& kept,
                                         const StridedArgs& red, O* __restrict__ out, u64 n_out,
                                         u64 r) {
    for (u64 o = blockIdx.x; o < n_out; o += gridDim.x) {
        const u64 base = strided_at(kept, o);
        S s = S::identity();
        for (u64 j = threadIdx.x; j < r; j += blockDim.x) {
            S e;
            e.v = key(x[base + strided_at(red, j)]);
            s = S::combine(s, e);
        }
        s = block_reduce(s, S::identity());
        if (threadIdx.x == 0) store(&out[o], s.v);
    }
}

#define KILN_SUM(NAME, T, S, O)                                                                \
    extern "C" __global__ void kiln_reduce_sum_##NAME(const T* __restrict__ x, StridedArgs kept, \
                                                      StridedArgs red, O* __restrict__ out,     \
                                                      u64 n_out, u64 r) {                       \
        sum_impl<T, S, O>(x, kept, red, out, n_out, r);                                        \
    }

KILN_SUM(f32, float, SumF, float)
KILN_SUM(f64, double, SumF, double)
KILN_SUM(f16, __half, SumF, __half)
KILN_SUM(bf16, __nv_bfloat16, SumF, __nv_bfloat16)
KILN_SUM(i64, i64, SumI, i64)
KILN_SUM(u8, unsigned char, SumI, i64)
KILN_SUM(bool, unsigned char, SumI, i64)

template <typename T, typename K>
__device__ __forceinline__ void extreme_impl(const T* __restrict__ x, const StridedArgs& kept,
                                             const StridedArgs& red, T* __restrict__ out,
                                             i64* __restrict__ idx, u64 n_out, u64 r, int largest,
                                             int want_index) {
    typedef Extreme<K> S;
    const S identity = S::identity_for(largest);
    for (u64 o = blockIdx.x; o < n_out; o += gridDim.x) {
        const u64 base = strided_at(kept, o);
        S s = identity;
        for (u64 j = threadIdx.x; j < r; j += blockDim.x) {
            S e = identity;
            e.v = key(x[base + strided_at(red, j)]);
            e.idx = j;
            e.valid = 1;
            s = S::combine(s, e);
        }
        s = block_reduce(s, identity);
        if (threadIdx.x == 0) {
            if (want_index) {
                idx[o] = s.valid ? (i64)s.idx : 0;
            } else if (s.valid) {
                store(&out[o], s.v);
            } else {
                store(&out[o], __longlong_as_double(0x7FF8000000000000LL)); // empty: NaN
            }
        }
    }
}

#define KILN_EXTREME(NAME, T, K)                                                                \
    extern "C" __global__ void kiln_reduce_extreme_##NAME(                                      \
        const T* __restrict__ x, StridedArgs kept, StridedArgs red, T* __restrict__ out,         \
        i64* __restrict__ idx, u64 n_out, u64 r, int largest, int want_index) {                  \
        extreme_impl<T, K>(x, kept, red, out, idx, n_out, r, largest, want_index);              \
    }

KILN_EXTREME(f32, float, double)
KILN_EXTREME(f64, double, double)
KILN_EXTREME(f16, __half, double)
KILN_EXTREME(bf16, __nv_bfloat16, double)
KILN_EXTREME(i64, i64, i64)
KILN_EXTREME(u8, unsigned char, i64)
KILN_EXTREME(bool, unsigned char, i64)
