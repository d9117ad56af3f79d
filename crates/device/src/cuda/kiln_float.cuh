// The accumulator of each float element type and the conversions to and from it (round to
// nearest once), shared by the kernels that compute 16-bit tensors in f32 registers (conv, pool,
// norm). Spliced in like kiln_common.cuh (see there); needs <cuda_fp16.h> and <cuda_bf16.h>.

template <typename T> struct Acc { typedef float type; };
template <> struct Acc<double> { typedef double type; };
__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ double widen(double v) { return v; }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(double* p, double v) { *p = v; }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
