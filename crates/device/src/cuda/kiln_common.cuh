// What every kiln kernel file shares: integer types, the strided-view argument and its index
// math, and the grid-stride loop. A `.cu` file takes it with `#include "kiln_common.cuh"`,
// which kiln's loader (cuda/kernels.rs, `expand_includes`) replaces by this text before NVRTC
// sees the file, framed by `#line` directives so compile errors still name the right file and
// line; `cargo xtask kernels` and the host emulation (tests/kernel_emulation) read it the same
// way. Include it once per file, after the CUDA headers.

typedef unsigned long long u64;
typedef long long i64;

#define KILN_MAX_DIMS 8

// A strided view: element i (row-major over `shape`) sits at offset + Σ coord_d * strides[d].
// Must match `StridedArgs` in cuda/launch.rs field for field (checked on both sides).
struct StridedArgs {
    u64 offset;
    u64 shape[KILN_MAX_DIMS];
    u64 strides[KILN_MAX_DIMS];
    unsigned int ndim;
    unsigned int pad;
};
static_assert(sizeof(StridedArgs) == 144 && alignof(StridedArgs) == 8, "StridedArgs layout");

__device__ __forceinline__ u64 strided_at(const StridedArgs& l, u64 i) {
    u64 at = l.offset;
    for (int d = (int)l.ndim - 1; d >= 0; --d) {
        const u64 size = l.shape[d];
        at += (i % size) * l.strides[d];
        i /= size;
    }
    return at;
}

// strided_at for i < 2^32 in a view of fewer than 2^32 elements (so every size fits too):
// 32-bit divide and modulo, several times cheaper than the emulated 64-bit ones.
__device__ __forceinline__ u64 strided_at32(const StridedArgs& l, unsigned i) {
    u64 at = l.offset;
    for (int d = (int)l.ndim - 1; d >= 0; --d) {
        const unsigned size = (unsigned)l.shape[d];
        at += (u64)(i % size) * l.strides[d];
        i /= size;
    }
    return at;
}

// for (u64 i = global thread index; i < n; i += every thread of the grid): any n fits a
// capped grid.
#define GRID_STRIDE(i, n)                                                                    \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x, step_ = (u64)gridDim.x * blockDim.x; \
         i < (n); i += step_)
