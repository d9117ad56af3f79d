// Multi-tensor kernels for gradient clipping: two launches for any number of tensors.
//
// The host builds, once per parameter set, a device-side table of tensors (pointer, length,
// dtype, and the range of chunks each one owns) and a table of fixed-size chunks (tensor index,
// first element, length; 64-bit offsets, so tensors past 2^31 elements work). Then:
//
// kiln_mt_norm: every block reduces its chunks (grid-stride over the chunk table) into one f32
//   partial per chunk, written to `chunk_partials`. After a __threadfence each block takes a
//   ticket; the block that draws the last ticket combines the partials of each tensor in chunk
//   order (so the result does not depend on which block ran which chunk), takes the norm of the
//   per-tensor norms, writes {total_norm, clip_coef} to `result`, and resets the ticket counter
//   so the same buffers serve the next step. Nothing returns to the host.
// kiln_mt_scale: reads clip_coef from `result` on the device and returns at once when it is
//   >= 1 (a NaN coefficient still scales, as PyTorch does); otherwise multiplies every element.
//
// Half types are widened to f32 as they are read and accumulated in f32.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define KILN_MT_THREADS 256

struct KilnMtTensor {
    unsigned long long ptr;
    unsigned long long len;
    unsigned int dtype;        // 0 f32, 1 f64, 2 f16, 3 bf16
    unsigned int first_chunk;  // index of the tensor's first chunk in the chunk table
    unsigned int num_chunks;   // how many chunks it owns (0 for an empty tensor)
    unsigned int pad;
};

struct KilnMtChunk {
    unsigned long long start;
    unsigned long long len;
    unsigned int tensor;
    unsigned int pad;
};

// The tables are uploaded as bytes from #[repr(C)] Rust twins (cuda.rs, cuda/sgd.rs), which
// assert the same sizes (and the offsets of their fields).
static_assert(sizeof(KilnMtTensor) == 32 && alignof(KilnMtTensor) == 8,
              "KilnMtTensor layout");
static_assert(sizeof(KilnMtChunk) == 24 && alignof(KilnMtChunk) == 8,
              "KilnMtChunk layout");

// kind: 0 count nonzero, 1 sum |x|, 2 sum x^2, 3 max |x|, 4 min |x|, 5 sum |x|^p
__device__ __forceinline__ float kiln_mt_identity(int kind) {
    return kind == 4 ? __int_as_float(0x7f800000) : 0.0f;
}

__device__ __forceinline__ float kiln_mt_combine(int kind, float a, float b) {
    if (kind == 3) return (isnan(a) || b > a) ? (isnan(a) ? a : b) : (isnan(b) ? b : a);
    if (kind == 4) return (isnan(a) || b < a) ? (isnan(a) ? a : b) : (isnan(b) ? b : a);
    return a + b;
}

__device__ __forceinline__ float kiln_mt_element(int kind, float p, float x) {
    float a = fabsf(x);
    switch (kind) {
        case 0: return a != 0.0f ? 1.0f : 0.0f;
        case 2: return a * a;
        case 5: return powf(a, p);
        default: return a;
    }
}

__device__ __forceinline__ float kiln_mt_finish(int kind, float p, float r) {
    if (kind == 2) return sqrtf(r);
    if (kind == 5) return powf(r, 1.0f / p);
    return r;
}

__device__ __forceinline__ float kiln_mt_load(const KilnMtTensor& t, unsigned long long i) {
    switch (t.dtype) {
        case 0: return reinterpret_cast<const float*>(t.ptr)[i];
        case 1: return (float)reinterpret_cast<const double*>(t.ptr)[i];
        case 2: return __half2float(reinterpret_cast<const __half*>(t.ptr)[i]);
        default: return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(t.ptr)[i]);
    }
}

__device__ __forceinline__ void kiln_mt_store_scaled(const KilnMtTensor& t, unsigned long long i,
                                                     float coef) {
    switch (t.dtype) {
        case 0: { float* p = reinterpret_cast<float*>(t.ptr); p[i] = p[i] * coef; break; }
        case 1: { double* p = reinterpret_cast<double*>(t.ptr); p[i] = p[i] * (double)coef; break; }
        case 2: {
            __half* p = reinterpret_cast<__half*>(t.ptr);
            p[i] = __float2half(__half2float(p[i]) * coef);
            break;
        }
        default: {
            __nv_bfloat16* p = reinterpret_cast<__nv_bfloat16*>(t.ptr);
            p[i] = __float2bfloat16(__bfloat162float(p[i]) * coef);
            break;
        }
    }
}

// Fixed-shape tree reduction of one value per thread; the result is in shared[0].
__device__ float kiln_mt_block_reduce(int kind, float v, float* shared) {
    shared[threadIdx.x] = v;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            shared[threadIdx.x] = kiln_mt_combine(kind, shared[threadIdx.x], shared[threadIdx.x + s]);
        }
        __syncthreads();
    }
    float r = shared[0];
    __syncthreads();
    return r;
}

extern "C" __global__ void kiln_mt_norm(const KilnMtTensor* tensors, unsigned int num_tensors,
                                        const KilnMtChunk* chunks, unsigned int num_chunks,
                                        int kind, float p, float max_norm,
                                        float* chunk_partials, unsigned int* ticket,
                                        float* result) {
    __shared__ float shared[KILN_MT_THREADS];
    __shared__ bool is_last;
    for (unsigned int c = blockIdx.x; c < num_chunks; c += gridDim.x) {
        const KilnMtChunk chunk = chunks[c];
        const KilnMtTensor t = tensors[chunk.tensor];
        float acc = kiln_mt_identity(kind);
        for (unsigned long long i = threadIdx.x; i < chunk.len; i += blockDim.x) {
            acc = kiln_mt_combine(kind, acc, kiln_mt_element(kind, p, kiln_mt_load(t, chunk.start + i)));
        }
        float r = kiln_mt_block_reduce(kind, acc, shared);
        if (threadIdx.x == 0) chunk_partials[c] = r;
    }
    __threadfence();
    if (threadIdx.x == 0) {
        unsigned int done = atomicAdd(ticket, 1u);
        is_last = (done == gridDim.x - 1);
    }
    __syncthreads();
    if (!is_last) return;
    // The last block: per-tensor norms in chunk order, then the norm of the norms.
    float acc = kiln_mt_identity(kind);
    for (unsigned int ti = threadIdx.x; ti < num_tensors; ti += blockDim.x) {
        const KilnMtTensor t = tensors[ti];
        float r = kiln_mt_identity(kind);
        for (unsigned int k = 0; k < t.num_chunks; ++k) {
            r = kiln_mt_combine(kind, r, ((volatile float*)chunk_partials)[t.first_chunk + k]);
        }
        acc = kiln_mt_combine(kind, acc, kiln_mt_element(kind, p, kiln_mt_finish(kind, p, r)));
    }
    float total = kiln_mt_finish(kind, p, kiln_mt_block_reduce(kind, acc, shared));
    if (threadIdx.x == 0) {
        float coef = max_norm / (total + 1e-6f);
        result[0] = total;
        result[1] = isnan(coef) ? coef : fminf(coef, 1.0f);
        *ticket = 0u;
    }
}

extern "C" __global__ void kiln_mt_scale(const KilnMtTensor* tensors, const KilnMtChunk* chunks,
                                         unsigned int num_chunks, const float* result) {
    const float coef = result[1];
    if (coef >= 1.0f) return;
    for (unsigned int c = blockIdx.x; c < num_chunks; c += gridDim.x) {
        const KilnMtChunk chunk = chunks[c];
        const KilnMtTensor t = tensors[chunk.tensor];
        for (unsigned long long i = threadIdx.x; i < chunk.len; i += blockDim.x) {
            kiln_mt_store_scaled(t, chunk.start + i, coef);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// kiln_mt_adam_f32: one Adam/AdamW step over every f32 parameter of a group in one launch.
//
// The table holds, per parameter, the addresses of the parameter, gradient, both moments and
// (amsgrad) the running maximum, its length, and the step's two per-parameter scalars computed
// on the host in double precision (lr / (1 - beta1^t) and sqrt(1 - beta2^t); step counts are per
// parameter). Chunks are the same (tensor, start, len) table as for clipping. `clip` may point
// at a clip plan's {total_norm, clip_coef}: the gradient is then read times the coefficient
// (when it is below 1, or NaN), so clipping costs no extra pass and no host synchronisation.

struct KilnMtAdamTensor {
    unsigned long long param;
    unsigned long long grad;
    unsigned long long exp_avg;
    unsigned long long exp_avg_sq;
    unsigned long long max_exp_avg_sq;  // 0 unless amsgrad
    unsigned long long len;
    float step_size;
    float bias_correction2_sqrt;
};
static_assert(sizeof(KilnMtAdamTensor) == 56 && alignof(KilnMtAdamTensor) == 8,
              "KilnMtAdamTensor layout");

extern "C" __global__ void kiln_mt_adam_f32(const KilnMtAdamTensor* tensors,
                                            const KilnMtChunk* chunks, unsigned int num_chunks,
                                            float beta1_weight, float beta2, float beta2_weight,
                                            float eps, float weight_decay, float decay,
                                            float grad_scale, int l2, int decoupled,
                                            const float* clip) {
    float scale = grad_scale;
    if (clip != nullptr) {
        const float coef = clip[1];
        if (!(coef >= 1.0f)) scale *= coef;
    }
    for (unsigned int c = blockIdx.x; c < num_chunks; c += gridDim.x) {
        const KilnMtChunk chunk = chunks[c];
        const KilnMtAdamTensor t = tensors[chunk.tensor];
        float* p = reinterpret_cast<float*>(t.param);
        const float* g = reinterpret_cast<const float*>(t.grad);
        float* m = reinterpret_cast<float*>(t.exp_avg);
        float* v = reinterpret_cast<float*>(t.exp_avg_sq);
        float* vmax = reinterpret_cast<float*>(t.max_exp_avg_sq);
        for (unsigned long long k = threadIdx.x; k < chunk.len; k += blockDim.x) {
            const unsigned long long i = chunk.start + k;
            float pi = p[i];
            float d = g[i] * scale;
            if (decoupled) pi = pi * decay;
            if (l2) d = d + pi * weight_decay;
            float mi = m[i];
            // PyTorch's lerp: the second form for a weight of 0.5 or more (exact at 1).
            mi = fabsf(beta1_weight) < 0.5f ? mi + beta1_weight * (d - mi)
                                            : d - (d - mi) * (1.0f - beta1_weight);
            float vi = v[i] * beta2 + beta2_weight * d * d;
            float second = vi;
            if (vmax != nullptr) {
                float x = vmax[i];
                if (vi > x || isnan(vi)) x = vi;
                vmax[i] = x;
                second = x;
            }
            const float denom = sqrtf(second) / t.bias_correction2_sqrt + eps;
            p[i] = pi + (-t.step_size) * (mi / denom);
            m[i] = mi;
            v[i] = vi;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// kiln_mt_sgd_f32: one SGD step over every f32 parameter of a group in one launch.
//
// The table holds, per parameter, the addresses of the parameter, gradient and momentum buffer
// (0 when momentum is 0), its length, and whether this is the buffer's first step (the buffer
// then takes the gradient as it is). The update is the CPU pass's, operation for operation, with
// explicitly rounded multiplies and adds (__fmul_rn/__fadd_rn) so the compiler does not contract
// them into FMAs and the result is bitwise the CPU's:
//   d = g * grad_scale [* clip_coef]; d += p * weight_decay (when has_wd);
//   b = first ? d : b * momentum + d * dampening_weight; d = nesterov ? d + b * momentum : b;
//   p = p + d * neg_lr.
// `grad_scale` already carries maximize's sign. `clip` as for Adam.

struct KilnMtSgdTensor {
    unsigned long long param;
    unsigned long long grad;
    unsigned long long momentum_buffer;  // 0 when momentum is 0
    unsigned long long len;
    unsigned int first;                  // 1 on the buffer's first step
    unsigned int pad;
};
static_assert(sizeof(KilnMtSgdTensor) == 40 && alignof(KilnMtSgdTensor) == 8,
              "KilnMtSgdTensor layout");

extern "C" __global__ void kiln_mt_sgd_f32(const KilnMtSgdTensor* tensors,
                                           const KilnMtChunk* chunks, unsigned int num_chunks,
                                           float neg_lr, float weight_decay, float momentum,
                                           float dampening_weight, float grad_scale,
                                           int scaled, int has_wd, int nesterov,
                                           const float* clip) {
    float scale = grad_scale;
    int apply_scale = scaled;
    if (clip != nullptr) {
        const float coef = clip[1];
        if (!(coef >= 1.0f)) {
            scale = __fmul_rn(scale, coef);
            apply_scale = 1;
        }
    }
    for (unsigned int c = blockIdx.x; c < num_chunks; c += gridDim.x) {
        const KilnMtChunk chunk = chunks[c];
        const KilnMtSgdTensor t = tensors[chunk.tensor];
        float* p = reinterpret_cast<float*>(t.param);
        const float* g = reinterpret_cast<const float*>(t.grad);
        float* b = reinterpret_cast<float*>(t.momentum_buffer);
        for (unsigned long long k = threadIdx.x; k < chunk.len; k += blockDim.x) {
            const unsigned long long i = chunk.start + k;
            const float pi = p[i];
            float d = g[i];
            if (apply_scale) d = __fmul_rn(d, scale);
            if (has_wd) d = __fadd_rn(d, __fmul_rn(pi, weight_decay));
            if (b != nullptr) {
                const float bi = t.first ? d
                                         : __fadd_rn(__fmul_rn(b[i], momentum),
                                                     __fmul_rn(d, dampening_weight));
                b[i] = bi;
                d = nesterov ? __fadd_rn(d, __fmul_rn(bi, momentum)) : bi;
            }
            p[i] = __fadd_rn(pi, __fmul_rn(d, neg_lr));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// kiln_mt_unscale: AMP's unscale fused with the non-finite check, one pass over every gradient.
//
// Every element is multiplied in place by `inv_scale` (f64 tensors by its widened value, half
// types computed in f32 and rounded back, as on the CPU); a value that is NaN or infinite
// *after* scaling, as stored, marks the block (every value non-finite before, and a finite one
// the unscale overflowed), and one thread of each marked block stores 1 to `found_inf`. The
// caller zeroes the flag before the launch and reads it once afterwards; only 1s are ever
// written, so the plain stores of different blocks need no atomics.

__device__ __forceinline__ bool kiln_mt_unscale_one(const KilnMtTensor& t, unsigned long long i,
                                                    float inv_scale) {
    switch (t.dtype) {
        case 0: {
            float* p = reinterpret_cast<float*>(t.ptr);
            const float y = __fmul_rn(p[i], inv_scale);
            p[i] = y;
            return !isfinite(y);
        }
        case 1: {
            double* p = reinterpret_cast<double*>(t.ptr);
            const double y = __dmul_rn(p[i], (double)inv_scale);
            p[i] = y;
            return !isfinite(y);
        }
        case 2: {
            __half* p = reinterpret_cast<__half*>(t.ptr);
            const __half y = __float2half(__fmul_rn(__half2float(p[i]), inv_scale));
            p[i] = y;
            return !isfinite(__half2float(y));
        }
        default: {
            __nv_bfloat16* p = reinterpret_cast<__nv_bfloat16*>(t.ptr);
            const __nv_bfloat16 y =
                __float2bfloat16(__fmul_rn(__bfloat162float(p[i]), inv_scale));
            p[i] = y;
            return !isfinite(__bfloat162float(y));
        }
    }
}

extern "C" __global__ void kiln_mt_unscale(const KilnMtTensor* tensors, const KilnMtChunk* chunks,
                                           unsigned int num_chunks, float inv_scale,
                                           unsigned int* found_inf) {
    int bad = 0;
    for (unsigned int c = blockIdx.x; c < num_chunks; c += gridDim.x) {
        const KilnMtChunk chunk = chunks[c];
        const KilnMtTensor t = tensors[chunk.tensor];
        for (unsigned long long k = threadIdx.x; k < chunk.len; k += blockDim.x) {
            if (kiln_mt_unscale_one(t, chunk.start + k, inv_scale)) bad = 1;
        }
    }
    // Every thread of the block runs the same number of chunk iterations, so all reach this.
    if (__syncthreads_or(bad) && threadIdx.x == 0) *found_inf = 1u;
}
