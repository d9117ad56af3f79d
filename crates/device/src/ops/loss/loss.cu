// Fused softmax + cross-entropy kernels (launched from cuda.rs; compiled at first use by NVRTC
// with kiln's one option list, and checked for sm_80/sm_90 by `cargo xtask kernels`).
//
// The math and the [N, C, D] view are described in mod.rs. On the GPU one thread block owns one
// position (n, d) at a time (grid-stride over positions): each thread runs the online softmax
// statistics (running max, rescaled running sum of exp) plus the q*w weighted sums over its
// strided share of the C classes, the block combines them (warp shuffles, then one value per
// warp through shared memory), thread 0 writes the loss, and every thread writes the gradient of
// its classes. Statistics are double, like the CPU kernel, so the two agree to rounding.
//
//   kiln_xent_index_<T>(logits, targets, weight, N, C, D, ignore_index, eps, with_grad,
//                       losses, grad, weight_sum)
//   kiln_xent_prob_<T>(logits, targets, weight, N, C, D, eps, with_grad, losses, grad)
// weight always points at C values (the launcher passes ones when there are no class weights);
// grad is written only when with_grad != 0. weight_sum accumulates the mean's denominator.
// T: f32, f64.
//
// Index targets are validated by the deferred check of cuda/deferred.cu, whose verdict the
// launcher reads only after this kernel ran, so a target that is neither ignore_index nor in
// [0, C) must be harmless here: its row gets a NaN loss and NaN gradient, adds nothing to
// weight_sum, and no logit or weight is read through it.

typedef unsigned long long u64;

#define KILN_XENT_BLOCK 256
#define KILN_WARPS (KILN_XENT_BLOCK / 32)
// NVRTC has no <math.h> macros: -inf and NaN from their bit patterns.
#define KILN_NEG_INF __longlong_as_double(0xfff0000000000000LL)
#define KILN_NAN __longlong_as_double(0x7ff8000000000000LL)

// A class's coefficient q_k * w_k: 0 when its target share q_k is 0, whatever its weight (a NaN
// or infinite weight of a class the target does not name must not reach the loss, as in
// PyTorch). A zero coefficient then adds nothing, even where the logit is -inf (masked).
__device__ __forceinline__ double share(double q, double w) { return q == 0.0 ? 0.0 : q * w; }

// Running (max, sum of exp(z - max)) pairs; max = -inf means "nothing seen".
struct MaxSum {
    double max;
    double sum;
};

__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
    if (b.max == KILN_NEG_INF) return a;
    if (a.max == KILN_NEG_INF) return b;
    if (isnan(a.max) || isnan(b.max)) return MaxSum{KILN_NAN, KILN_NAN};
    const double m = fmax(a.max, b.max);
    return MaxSum{m, a.sum * exp(a.max - m) + b.sum * exp(b.max - m)};
}

__device__ __forceinline__ MaxSum push(MaxSum a, double z) {
    if (isnan(z)) return MaxSum{z, z};
    if (z == KILN_NEG_INF) return a;  // masked class: adds nothing
    if (z > a.max) return MaxSum{z, a.sum * exp(a.max - z) + 1.0};
    return MaxSum{a.max, a.sum + exp(z - a.max)};
}

// Block-wide reduction of (max, sum) and two plain sums; every thread gets the results.
__device__ __forceinline__ void block_reduce(MaxSum& ms, double& s1, double& s2) {
    __shared__ double sh_max[KILN_WARPS], sh_sum[KILN_WARPS], sh_s1[KILN_WARPS], sh_s2[KILN_WARPS];
    for (int off = 16; off > 0; off >>= 1) {
        MaxSum other{__shfl_down_sync(0xffffffffu, ms.max, off),
                     __shfl_down_sync(0xffffffffu, ms.sum, off)};
        ms = combine(ms, other);
        s1 += __shfl_down_sync(0xffffffffu, s1, off);
        s2 += __shfl_down_sync(0xffffffffu, s2, off);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        sh_max[warp] = ms.max;
        sh_sum[warp] = ms.sum;
        sh_s1[warp] = s1;
        sh_s2[warp] = s2;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        MaxSum all{sh_max[0], sh_sum[0]};
        double a = sh_s1[0], b = sh_s2[0];
        for (int w = 1; w < KILN_WARPS; ++w) {
            all = combine(all, MaxSum{sh_max[w], sh_sum[w]});
            a += sh_s1[w];
            b += sh_s2[w];
        }
        sh_max[0] = all.max;
        sh_sum[0] = all.sum;
        sh_s1[0] = a;
        sh_s2[0] = b;
    }
    __syncthreads();
    ms = MaxSum{sh_max[0], sh_sum[0]};
    s1 = sh_s1[0];
    s2 = sh_s2[0];
    __syncthreads();  // the shared slots are reused by the next position
}

template <typename T>
__device__ void xent_index(const T* __restrict__ logits, const long long* __restrict__ targets,
                           const T* __restrict__ weight, u64 n_batch, u64 c, u64 d,
                           long long ignore_index, double eps, int with_grad,
                           T* __restrict__ losses, T* __restrict__ grad,
                           double* __restrict__ weight_sum) {
    const double smooth = eps / (double)c;
    const u64 positions = n_batch * d;
    for (u64 pos = blockIdx.x; pos < positions; pos += gridDim.x) {
        const u64 n = pos / d, j = pos % d;
        const u64 base = n * c * d + j;
        const long long y = targets[pos];
        if (y == ignore_index) {
            if (threadIdx.x == 0) losses[pos] = (T)0;
            if (with_grad)
                for (u64 k = threadIdx.x; k < c; k += blockDim.x) grad[base + k * d] = (T)0;
            continue;
        }
        if (y < 0 || (u64)y >= c) {  // reported by the deferred target check
            if (threadIdx.x == 0) losses[pos] = (T)KILN_NAN;
            if (with_grad)
                for (u64 k = threadIdx.x; k < c; k += blockDim.x) grad[base + k * d] = (T)KILN_NAN;
            continue;
        }
        MaxSum ms{KILN_NEG_INF, 0.0};
        double qwz = 0.0, qw = 0.0;
        for (u64 k = threadIdx.x; k < c; k += blockDim.x) {
            const double z = (double)logits[base + k * d];
            ms = push(ms, z);
            const double qwk = share(smooth, (double)weight[k]);
            if (qwk != 0.0) {
                qwz += qwk * z;
                qw += qwk;
            }
        }
        block_reduce(ms, qwz, qw);
        const double wy = (double)weight[y];
        const double qwy = share(1.0 - eps, wy);
        if (qwy != 0.0) {
            qwz += qwy * (double)logits[base + (u64)y * d];
            qw += qwy;
        }
        const double lse = ms.max + log(ms.sum);
        if (threadIdx.x == 0) {
            losses[pos] = (T)(qw * lse - qwz);
            atomicAdd(weight_sum, wy);
        }
        if (with_grad) {
            for (u64 k = threadIdx.x; k < c; k += blockDim.x) {
                const double q = smooth + ((long long)k == y ? 1.0 - eps : 0.0);
                const double p = exp((double)logits[base + k * d] - lse);
                grad[base + k * d] = (T)(p * qw - share(q, (double)weight[k]));
            }
        }
    }
}

template <typename T>
__device__ void xent_prob(const T* __restrict__ logits, const T* __restrict__ targets,
                          const T* __restrict__ weight, u64 n_batch, u64 c, u64 d, double eps,
                          int with_grad, T* __restrict__ losses, T* __restrict__ grad) {
    const double smooth = eps / (double)c;
    const u64 positions = n_batch * d;
    for (u64 pos = blockIdx.x; pos < positions; pos += gridDim.x) {
        const u64 n = pos / d, j = pos % d;
        const u64 base = n * c * d + j;
        MaxSum ms{KILN_NEG_INF, 0.0};
        double qwz = 0.0, qw = 0.0;
        for (u64 k = threadIdx.x; k < c; k += blockDim.x) {
            const double z = (double)logits[base + k * d];
            ms = push(ms, z);
            const double qwk =
                share((1.0 - eps) * (double)targets[base + k * d] + smooth, (double)weight[k]);
            if (qwk != 0.0) {  // 0 * -inf must not turn a masked class into NaN
                qwz += qwk * z;
                qw += qwk;
            }
        }
        block_reduce(ms, qwz, qw);
        const double lse = ms.max + log(ms.sum);
        if (threadIdx.x == 0) losses[pos] = (T)(qw * lse - qwz);
        if (with_grad) {
            for (u64 k = threadIdx.x; k < c; k += blockDim.x) {
                const double q = (1.0 - eps) * (double)targets[base + k * d] + smooth;
                const double p = exp((double)logits[base + k * d] - lse);
                grad[base + k * d] = (T)(p * qw - share(q, (double)weight[k]));
            }
        }
    }
}

#define KILN_XENT(NAME, T)                                                                     \
    extern "C" __global__ void __launch_bounds__(KILN_XENT_BLOCK) kiln_xent_index_##NAME(     \
        const T* __restrict__ logits, const long long* __restrict__ targets,                   \
        const T* __restrict__ weight, u64 n, u64 c, u64 d, long long ignore_index, double eps, \
        int with_grad, T* __restrict__ losses, T* __restrict__ grad,                           \
        double* __restrict__ weight_sum) {                                                     \
        xent_index<T>(logits, targets, weight, n, c, d, ignore_index, eps, with_grad, losses,  \
                      grad, weight_sum);                                                       \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(KILN_XENT_BLOCK) kiln_xent_prob_##NAME(      \
        const T* __restrict__ logits, const T* __restrict__ targets,                           \
        const T* __restrict__ weight, u64 n, u64 c, u64 d, double eps, int with_grad,          \
        T* __restrict__ losses, T* __restrict__ grad) {                                        \
        xent_prob<T>(logits, targets, weight, n, c, d, eps, with_grad, losses, grad);          \
    }

KILN_XENT(f32, float)
KILN_XENT(f64, double)
