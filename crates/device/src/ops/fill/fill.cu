// Fill and strided copy kernels (launched from cuda.rs; compiled at first use by NVRTC with
// kiln's one option list, and checked for sm_80/sm_90 by `cargo xtask kernels`).
//
// One template per operation, instantiated under extern "C" names the Rust side looks up:
//   kiln_fill_<dtype>(T* dst, T value, u64 n)                          dtype: f32 f64 f16 bf16 i32 i64 u8
//   kiln_copy_strided_b<bytes>(const T* src, u64 offset, StridedArgs layout, T* dst, u64 n)
// Copy moves bits, so it is instantiated per element size (1, 2, 4, 8 bytes), not per dtype.
// Both are grid-stride loops: any grid size covers any n, so the launcher can cap the grid.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

typedef unsigned long long u64;

#define KILN_MAX_DIMS 8

// Must match `StridedArgs` in cuda.rs field for field (#[repr(C)]).
struct StridedArgs {
    u64 shape[KILN_MAX_DIMS];
    u64 strides[KILN_MAX_DIMS];
    unsigned int ndim;
    unsigned int pad;
};
// The same numbers cuda.rs asserts for its #[repr(C)] twin.
static_assert(sizeof(StridedArgs) == 136 && alignof(StridedArgs) == 8, "StridedArgs layout");

template <typename T>
__device__ __forceinline__ void fill_impl(T* __restrict__ dst, T value, u64 n) {
    const u64 step = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        dst[i] = value;
    }
}

#define KILN_FILL(NAME, T)                                                          \
    extern "C" __global__ void kiln_fill_##NAME(T* __restrict__ dst, T value, u64 n) { \
        fill_impl<T>(dst, value, n);                                                \
    }

KILN_FILL(f32, float)
KILN_FILL(f64, double)
KILN_FILL(f16, __half)
KILN_FILL(bf16, __nv_bfloat16)
KILN_FILL(i32, int)
KILN_FILL(i64, long long)
KILN_FILL(u8, unsigned char)

// dst[i] = src[offset + sum_d idx_d(i) * strides[d]], idx(i) the row-major multi-index of i.
template <typename T>
__device__ __forceinline__ void copy_strided_impl(const T* __restrict__ src, u64 offset,
                                                  const StridedArgs& layout, T* __restrict__ dst,
                                                  u64 n) {
    const u64 step = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        u64 rest = i;
        u64 at = offset;
        for (int d = (int)layout.ndim - 1; d >= 0; --d) {
            const u64 size = layout.shape[d];
            at += (rest % size) * layout.strides[d];
            rest /= size;
        }
        dst[i] = src[at];
    }
}

#define KILN_COPY(BYTES, T)                                                                 \
    extern "C" __global__ void kiln_copy_strided_b##BYTES(const T* __restrict__ src, u64 offset, \
                                                          StridedArgs layout, T* __restrict__ dst, \
                                                          u64 n) {                          \
        copy_strided_impl<T>(src, offset, layout, dst, n);                                  \
    }

KILN_COPY(1, unsigned char)
KILN_COPY(2, unsigned short)
KILN_COPY(4, unsigned int)
KILN_COPY(8, u64)
