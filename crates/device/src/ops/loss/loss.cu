// Fused softmax + cross-entropy kernels (launched from cuda.rs; compiled at first use by NVRTC
// with kiln's one option list, and checked for sm_80/sm_90 by `cargo xtask kernels`).
//
// The math and the [N, C, D] view are described in mod.rs. On the GPU one thread block owns one
// position (n, d) at a time (grid-stride over positions): each thread runs the row statistics
// of `Stats` (online softmax max and sum, S = sum of q*w, the shifted sum) over its strided share
// of the C classes, the block combines them (warp shuffles, then one value per warp through
// shared memory), thread 0 writes the loss, and every thread writes the gradient of its classes.
// Statistics are double, like the CPU kernel, so the two agree to rounding.
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

// A thread's (or a block's) statistics of a row: the running max, the rescaled running sum of
// exp(z - max), S = sum of q*w, and the shifted sum of q*w*(z - max) against that max (moved by
// (old - new) * S when the max rises). max = -inf means "no finite logit seen"; a masked (-inf)
// logit with a nonzero coefficient makes `shifted` -inf (an infinite loss).
struct Stats {
    double max;
    double sum;
    double qw;
    double shifted;
};

// z - max, with a masked logit kept at -inf even while max is still -inf.
__device__ __forceinline__ double below(double z, double max) {
    return z == KILN_NEG_INF ? z : z - max;
}

// `shifted` moved from the old max to m (no move when nothing weighs or the max is unchanged,
// which also keeps -inf - -inf and inf - inf out).
__device__ __forceinline__ double moved(Stats a, double m) {
    return (a.qw == 0.0 || a.max == m) ? a.shifted : a.shifted + (a.max - m) * a.qw;
}

__device__ __forceinline__ Stats combine(Stats a, Stats b) {
    const double qw = a.qw + b.qw;
    if (isnan(a.max) || isnan(b.max)) return Stats{KILN_NAN, KILN_NAN, qw, KILN_NAN};
    if (b.max == KILN_NEG_INF) return Stats{a.max, a.sum, qw, a.shifted + moved(b, a.max)};
    if (a.max == KILN_NEG_INF) return Stats{b.max, b.sum, qw, moved(a, b.max) + b.shifted};
    const double m = fmax(a.max, b.max);
    return Stats{m, a.sum * exp(a.max - m) + b.sum * exp(b.max - m), qw,
                 moved(a, m) + moved(b, m)};
}

// One class: logit z with coefficient qwk (0 adds nothing to S or the shifted sum).
__device__ __forceinline__ Stats push(Stats a, double z, double qwk) {
    if (isnan(z)) return Stats{z, z, a.qw + qwk, z};
    if (z > a.max) {
        a.shifted = moved(a, z);
        a.sum = a.sum * exp(a.max - z) + 1.0;
        a.max = z;
    } else if (z != KILN_NEG_INF) {  // masked classes add nothing to the sum
        a.sum += exp(z - a.max);
    }
    if (qwk != 0.0) {
        a.shifted += qwk * below(z, a.max);
        a.qw += qwk;
    }
    return a;
}

// Block-wide reduction of the statistics; every thread gets the block's.
__device__ __forceinline__ Stats block_reduce(Stats st) {
    __shared__ double sh_max[KILN_WARPS], sh_sum[KILN_WARPS], sh_qw[KILN_WARPS],
        sh_shifted[KILN_WARPS];
    for (int off = 16; off > 0; off >>= 1) {
        Stats other{__shfl_down_sync(0xffffffffu, st.max, off),
                    __shfl_down_sync(0xffffffffu, st.sum, off),
                    __shfl_down_sync(0xffffffffu, st.qw, off),
                    __shfl_down_sync(0xffffffffu, st.shifted, off)};
        st = combine(st, other);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        sh_max[warp] = st.max;
        sh_sum[warp] = st.sum;
        sh_qw[warp] = st.qw;
        sh_shifted[warp] = st.shifted;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        Stats all{sh_max[0], sh_sum[0], sh_qw[0], sh_shifted[0]};
        for (int w = 1; w < KILN_WARPS; ++w)
            all = combine(all, Stats{sh_max[w], sh_sum[w], sh_qw[w], sh_shifted[w]});
        sh_max[0] = all.max;
        sh_sum[0] = all.sum;
        sh_qw[0] = all.qw;
        sh_shifted[0] = all.shifted;
    }
    __syncthreads();
    st = Stats{sh_max[0], sh_sum[0], sh_qw[0], sh_shifted[0]};
    __syncthreads();  // the shared slots are reused by the next position
    return st;
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
        Stats st{KILN_NEG_INF, 0.0, 0.0, 0.0};
        for (u64 k = threadIdx.x; k < c; k += blockDim.x)
            st = push(st, (double)logits[base + k * d], share(smooth, (double)weight[k]));
        st = block_reduce(st);
        const double wy = (double)weight[y];
        const double qwy = share(1.0 - eps, wy);
        if (qwy != 0.0) {
            st.shifted += qwy * below((double)logits[base + (u64)y * d], st.max);
            st.qw += qwy;
        }
        // loss = S * ln(sum) - shifted; ln(sum) is never added to max (it would round away
        // beyond 1e16), so probabilities are exp((z - max) - ln(sum)).
        const double log_sum = log(st.sum);
        if (threadIdx.x == 0) {
            losses[pos] = (T)(st.qw * log_sum - st.shifted);
            atomicAdd(weight_sum, wy);
        }
        if (with_grad) {
            for (u64 k = threadIdx.x; k < c; k += blockDim.x) {
                const double q = smooth + ((long long)k == y ? 1.0 - eps : 0.0);
                const double p = exp(((double)logits[base + k * d] - st.max) - log_sum);
                grad[base + k * d] = (T)(p * st.qw - share(q, (double)weight[k]));
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
        Stats st{KILN_NEG_INF, 0.0, 0.0, 0.0};
        for (u64 k = threadIdx.x; k < c; k += blockDim.x) {
            const double q = (1.0 - eps) * (double)targets[base + k * d] + smooth;
            st = push(st, (double)logits[base + k * d], share(q, (double)weight[k]));
        }
        st = block_reduce(st);
        const double log_sum = log(st.sum);
        if (threadIdx.x == 0) losses[pos] = (T)(st.qw * log_sum - st.shifted);
        if (with_grad) {
            for (u64 k = threadIdx.x; k < c; k += blockDim.x) {
                const double q = (1.0 - eps) * (double)targets[base + k * d] + smooth;
                const double p = exp(((double)logits[base + k * d] - st.max) - log_sum);
                grad[base + k * d] = (T)(p * st.qw - share(q, (double)weight[k]));
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
