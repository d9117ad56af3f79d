//! CPU multi-tensor kernels: a rayon pass over fixed chunks of a tensor list (see the module
//! docs in `mod.rs` for the chunking and determinism rules).
//!
//! Each function runs on the rayon pool it is called from (install kiln's pool,
//! [`crate::threads::cpu_pool`], or any other); results never depend on that pool's size.
//! Reductions read a chunk with eight independent `f64` accumulators (so the loop vectorises and
//! rounding error stays small; `f32` 1- and 2-norms use [`sum_f32_blocked`] instead), combine
//! them in a fixed tree, then combine chunks of a tensor in plan order on one thread. Small
//! chunks are batched into tasks of at least `CHUNK_ELEMS` elements ([`batch_ranges`]).

use super::{plan_chunks, Chunk, FloatSlice, FloatSliceMut, NormKind, CHUNK_ELEMS};
use half::{bf16, f16};
use rayon::prelude::*;

/// An element type the kernels read, widened to `f64` as it is read.
pub trait Widen: Copy + Send + Sync {
    /// The value as `f64` (exact for every float type).
    fn widen(self) -> f64;
}

impl Widen for f32 {
    #[inline(always)]
    fn widen(self) -> f64 {
        f64::from(self)
    }
}
impl Widen for f64 {
    #[inline(always)]
    fn widen(self) -> f64 {
        self
    }
}
impl Widen for f16 {
    #[inline(always)]
    fn widen(self) -> f64 {
        self.to_f64()
    }
}
impl Widen for bf16 {
    #[inline(always)]
    fn widen(self) -> f64 {
        self.to_f64()
    }
}

const LANES: usize = 8;

#[inline(always)]
fn fold_lanes(kind: NormKind, lanes: [f64; LANES]) -> f64 {
    let pair = |a, b| kind.combine(a, b);
    let q0 = pair(pair(lanes[0], lanes[1]), pair(lanes[2], lanes[3]));
    let q1 = pair(pair(lanes[4], lanes[5]), pair(lanes[6], lanes[7]));
    pair(q0, q1)
}

/// Runs `$body` (an expression over `$x: f64`, accumulated into `$acc` with `$step`) over lanes.
macro_rules! lane_loop {
    ($s:expr, $init:expr, |$acc:ident, $x:ident| $step:expr) => {{
        let mut lanes = [$init; LANES];
        let mut blocks = $s.chunks_exact(LANES);
        for block in &mut blocks {
            for i in 0..LANES {
                let $acc = lanes[i];
                let $x = block[i].widen();
                lanes[i] = $step;
            }
        }
        for (i, v) in blocks.remainder().iter().enumerate() {
            let $acc = lanes[i];
            let $x = v.widen();
            lanes[i] = $step;
        }
        lanes
    }};
}

/// The reduced value (sum of `|x|^p`, max/min of `|x|`, or nonzero count) of one slice.
pub fn reduce_slice<T: Widen>(s: &[T], kind: NormKind) -> f64 {
    let lanes = match kind {
        NormKind::Zero => lane_loop!(s, 0.0, |a, x| a + f64::from(u8::from(x != 0.0))),
        NormKind::One => lane_loop!(s, 0.0, |a, x| a + x.abs()),
        NormKind::Two => lane_loop!(s, 0.0, |a, x| a + x * x),
        NormKind::Inf => lane_loop!(s, 0.0, |a, x| {
            let v = x.abs();
            if v > a || v.is_nan() {
                v
            } else {
                a
            }
        }),
        NormKind::NegInf => lane_loop!(s, f64::INFINITY, |a, x| {
            let v = x.abs();
            if v < a || v.is_nan() {
                v
            } else {
                a
            }
        }),
        NormKind::P(p) => lane_loop!(s, 0.0, |a, x| a + x.abs().powf(p)),
    };
    fold_lanes(kind, lanes)
}

/// Elements per `f32` sub-block of [`sum_f32_blocked`]: 16 lanes of 16 values each, so an `f32`
/// lane never sums more than 16 terms before it is added into the `f64` total.
const SUB_BLOCK: usize = 256;

/// Sum of `x*x` (`square`) or `|x|` of `f32` data at full SIMD width: 16 `f32` lanes over
/// sub-blocks of 256 elements, each sub-block's lanes folded into `f64` in a fixed order.
pub fn sum_f32_blocked(s: &[f32], square: bool) -> f64 {
    let mut total = 0f64;
    for block in s.chunks(SUB_BLOCK) {
        let mut acc = [0f32; 16];
        let mut rows = block.chunks_exact(16);
        for row in &mut rows {
            for i in 0..16 {
                acc[i] += if square {
                    row[i] * row[i]
                } else {
                    row[i].abs()
                };
            }
        }
        for (i, x) in rows.remainder().iter().enumerate() {
            acc[i] += if square { x * x } else { x.abs() };
        }
        let mut folded = [0f64; 4];
        for (i, a) in acc.iter().enumerate() {
            folded[i % 4] += f64::from(*a);
        }
        total += (folded[0] + folded[1]) + (folded[2] + folded[3]);
    }
    total
}

fn reduce_float_slice(s: FloatSlice<'_>, kind: NormKind) -> f64 {
    match s {
        FloatSlice::F32(s) if kind == NormKind::Two => sum_f32_blocked(s, true),
        FloatSlice::F32(s) if kind == NormKind::One => sum_f32_blocked(s, false),
        FloatSlice::F32(s) => reduce_slice(s, kind),
        FloatSlice::F64(s) => reduce_slice(s, kind),
        FloatSlice::F16(s) => reduce_slice(s, kind),
        FloatSlice::BF16(s) => reduce_slice(s, kind),
    }
}

/// Per-tensor reduced values (before the final root): one parallel pass over the chunk plan,
/// then a fixed-order combine per tensor.
pub fn reduce_per_tensor(
    tensors: &[FloatSlice<'_>],
    kind: NormKind,
    chunk_elems: usize,
) -> Vec<f64> {
    let lens: Vec<usize> = tensors.iter().map(FloatSlice::len).collect();
    let plan: Vec<Chunk> = plan_chunks(&lens, chunk_elems);
    // Small chunks (tensors of a few thousand elements) are batched into tasks of at least
    // `CHUNK_ELEMS` elements so the pool's per-task cost stays small; batching only decides who
    // computes a chunk, never how, so the partials are the same for any batching.
    let tasks = batch_ranges(plan.iter().map(|c| c.len), chunk_elems);
    let partials: Vec<f64> = tasks
        .par_iter()
        .flat_map_iter(|r| {
            plan[r.clone()]
                .iter()
                .map(|c| reduce_float_slice(tensors[c.tensor].sub(c.start, c.len), kind))
        })
        .collect();
    let mut out = vec![kind.identity(); tensors.len()];
    for (c, p) in plan.iter().zip(partials) {
        out[c.tensor] = kind.combine(out[c.tensor], p);
    }
    out
}

/// The norm of each tensor (PyTorch's `vector_norm(g, p)` per gradient), in one parallel pass.
pub fn per_tensor_norms(tensors: &[FloatSlice<'_>], kind: NormKind) -> Vec<f64> {
    reduce_per_tensor(tensors, kind, CHUNK_ELEMS)
        .into_iter()
        .map(|r| kind.finish(r))
        .collect()
}

/// Consecutive index ranges over items of the given lengths, each (but the last) holding at
/// least `target` elements.
pub fn batch_ranges(
    lens: impl Iterator<Item = usize>,
    target: usize,
) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut acc, mut n) = (0, 0usize, 0);
    for len in lens {
        n += 1;
        acc += len;
        if acc >= target {
            out.push(start..n);
            start = n;
            acc = 0;
        }
    }
    if start < n {
        out.push(start..n);
    }
    out
}

/// Splits every tensor into chunks and batches small chunks into tasks of at least
/// `CHUNK_ELEMS` elements, for one parallel pass.
fn chunks_of<'a>(tensors: Vec<FloatSliceMut<'a>>) -> Vec<Vec<FloatSliceMut<'a>>> {
    let chunks: Vec<FloatSliceMut<'a>> = tensors
        .into_iter()
        .flat_map(|t| t.into_chunks(CHUNK_ELEMS))
        .collect();
    let ranges = batch_ranges(chunks.iter().map(FloatSliceMut::len), CHUNK_ELEMS);
    let mut it = chunks.into_iter();
    ranges
        .into_iter()
        .map(|r| it.by_ref().take(r.len()).collect())
        .collect()
}

/// Applies `f32`/`f64` maps to every element of every tensor, in parallel over chunks. Half types
/// go through the `f32` map (widened, mapped, rounded once).
fn map_all(
    tensors: Vec<FloatSliceMut<'_>>,
    f32_map: impl Fn(f32) -> f32 + Sync,
    f64_map: impl Fn(f64) -> f64 + Sync,
) {
    chunks_of(tensors)
        .into_par_iter()
        .flatten_iter()
        .for_each(|c| match c {
            FloatSliceMut::F32(s) => s.iter_mut().for_each(|x| *x = f32_map(*x)),
            FloatSliceMut::F64(s) => s.iter_mut().for_each(|x| *x = f64_map(*x)),
            FloatSliceMut::F16(s) => s
                .iter_mut()
                .for_each(|x| *x = f16::from_f32(f32_map(x.to_f32()))),
            FloatSliceMut::BF16(s) => s
                .iter_mut()
                .for_each(|x| *x = bf16::from_f32(f32_map(x.to_f32()))),
        });
}

/// Multiplies every element by `coef` (rounded to `f32` for `f32`/`f16`/`bf16` tensors, as
/// PyTorch multiplies a gradient by a coefficient of its own dtype).
pub fn scale_(tensors: Vec<FloatSliceMut<'_>>, coef: f64) {
    let c32 = coef as f32;
    map_all(tensors, |x| x * c32, |x| x * coef);
}

/// Clamps every element to `[-limit, limit]` (NaN stays NaN), PyTorch's `clip_grad_value_`.
pub fn clamp_(tensors: Vec<FloatSliceMut<'_>>, limit: f64) {
    let l32 = limit as f32;
    map_all(
        tensors,
        |x| if x.is_nan() { x } else { x.max(-l32).min(l32) },
        |x| {
            if x.is_nan() {
                x
            } else {
                x.max(-limit).min(limit)
            }
        },
    );
}

/// AMP's fused unscale: multiplies every element by `inv_scale` (an `f32`, as PyTorch keeps the
/// scale) and reports whether any element *before* scaling was NaN or infinite, in one pass.
pub fn unscale_and_check_(tensors: Vec<FloatSliceMut<'_>>, inv_scale: f32) -> bool {
    fn run<T: Copy>(s: &mut [T], finite: impl Fn(T) -> bool, f: impl Fn(T) -> T) -> bool {
        let mut bad = false;
        for x in s.iter_mut() {
            bad |= !finite(*x);
            *x = f(*x);
        }
        bad
    }
    let inv64 = f64::from(inv_scale);
    chunks_of(tensors)
        .into_par_iter()
        .flatten_iter()
        .map(|c| match c {
            FloatSliceMut::F32(s) => run(s, f32::is_finite, |x| x * inv_scale),
            FloatSliceMut::F64(s) => run(s, f64::is_finite, |x| x * inv64),
            FloatSliceMut::F16(s) => run(
                s,
                |x: f16| x.is_finite(),
                |x| f16::from_f32(x.to_f32() * inv_scale),
            ),
            FloatSliceMut::BF16(s) => run(
                s,
                |x: bf16| x.is_finite(),
                |x| bf16::from_f32(x.to_f32() * inv_scale),
            ),
        })
        .reduce(|| false, |a, b| a | b)
}

#[cfg(test)]
mod tests {
    use super::super::{clip_coef, NormKind};
    use super::*;

    fn pseudo_random(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
            })
            .collect()
    }

    fn naive_norm(xs: &[f64], p: f64) -> f64 {
        xs.iter()
            .map(|x| x.abs().powf(p))
            .sum::<f64>()
            .powf(1.0 / p)
    }

    #[test]
    fn norms_match_a_naive_sum_for_every_kind_and_odd_lengths() {
        let lens = [0usize, 1, 7, 9, 65_537, 200_003];
        let data: Vec<Vec<f32>> = lens.iter().map(|&n| pseudo_random(n, n as u64)).collect();
        let views: Vec<FloatSlice> = data.iter().map(|d| FloatSlice::F32(d)).collect();
        for p in [1.0, 2.0, 3.0, 0.5] {
            let kind = NormKind::from_norm_type(p).unwrap();
            let got = per_tensor_norms(&views, kind);
            for (d, g) in data.iter().zip(&got) {
                let wide: Vec<f64> = d.iter().map(|&x| f64::from(x)).collect();
                let want = naive_norm(&wide, p);
                // p = 1, 2 on f32 square and sum 16 terms per f32 lane before widening: f32 accuracy.
                let tol = if p == 1.0 || p == 2.0 { 2e-7 } else { 1e-12 };
                assert!(
                    (g - want).abs() <= tol * want.max(1.0),
                    "p={p}: {g} vs {want}"
                );
            }
        }
        let inf = per_tensor_norms(&views, NormKind::Inf);
        for (d, g) in data.iter().zip(&inf) {
            let want = d.iter().fold(0f32, |m, x| m.max(x.abs()));
            assert_eq!(*g, f64::from(want));
        }
        let zero = per_tensor_norms(&[FloatSlice::F32(&[0.0, 1.0, -0.0, 2.0])], NormKind::Zero);
        assert_eq!(zero, vec![2.0]);
        let ninf = per_tensor_norms(&[FloatSlice::F32(&[3.0, -1.0, 2.0])], NormKind::NegInf);
        assert_eq!(ninf, vec![1.0]);
    }

    #[test]
    fn result_is_bitwise_identical_for_any_thread_count() {
        let data: Vec<Vec<f32>> = (0..40)
            .map(|i| pseudo_random(1000 + i * 37_001, i as u64))
            .collect();
        let views: Vec<FloatSlice> = data.iter().map(|d| FloatSlice::F32(d)).collect();
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| per_tensor_norms(&views, NormKind::Two))
        };
        let one = run(1);
        for threads in [2, 3, 7] {
            let many = run(threads);
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&one), bits(&many), "{threads} threads");
        }
    }

    #[test]
    fn batches_cover_every_item_once() {
        let r = batch_ranges([5usize, 1, 1, 9, 2, 2].into_iter(), 6);
        assert_eq!(r, vec![0..2, 2..4, 4..6]);
        assert!(batch_ranges(std::iter::empty(), 6).is_empty());
        assert_eq!(batch_ranges([100usize].into_iter(), 6), vec![0..1]);
    }

    #[test]
    fn half_types_accumulate_wide() {
        // 70,000 ones: an f16 accumulator would stop at 2048; the norm must be sqrt(70000).
        let h = vec![f16::ONE; 70_000];
        let b = vec![bf16::ONE; 70_000];
        let norms = per_tensor_norms(&[FloatSlice::F16(&h), FloatSlice::BF16(&b)], NormKind::Two);
        assert_eq!(norms, vec![70_000f64.sqrt(); 2]);
        // f16 values whose squares overflow f16 (300^2 > 65504) still give a finite norm.
        let big = vec![f16::from_f32(300.0); 4];
        assert_eq!(
            per_tensor_norms(&[FloatSlice::F16(&big)], NormKind::Two),
            vec![600.0]
        );
    }

    #[test]
    fn nan_and_inf_propagate_like_pytorch() {
        let with_nan = [1.0f32, f32::NAN, 5.0];
        let with_inf = [1.0f32, f32::INFINITY];
        for kind in [
            NormKind::One,
            NormKind::Two,
            NormKind::Inf,
            NormKind::P(3.0),
        ] {
            assert!(per_tensor_norms(&[FloatSlice::F32(&with_nan)], kind)[0].is_nan());
            assert_eq!(
                per_tensor_norms(&[FloatSlice::F32(&with_inf)], kind)[0],
                f64::INFINITY
            );
        }
    }

    #[test]
    fn scale_clamp_and_unscale_touch_every_element_once() {
        let mut a = pseudo_random(100_001, 3);
        let mut h: Vec<f16> = (0..5).map(|i| f16::from_f32(i as f32)).collect();
        let mut e: Vec<f64> = vec![];
        let a0 = a.clone();
        scale_(
            vec![
                FloatSliceMut::F32(&mut a),
                FloatSliceMut::F16(&mut h),
                FloatSliceMut::F64(&mut e),
            ],
            0.5,
        );
        assert!(a.iter().zip(&a0).all(|(x, y)| *x == y * 0.5));
        assert_eq!(h[3], f16::from_f32(1.5));
        clamp_(vec![FloatSliceMut::F32(&mut a)], 0.25);
        assert!(a
            .iter()
            .zip(&a0)
            .all(|(x, y)| *x == (y * 0.5).clamp(-0.25, 0.25)));
        let mut g = vec![2.0f32, 4.0];
        let mut bad = vec![bf16::from_f32(8.0), bf16::INFINITY];
        assert!(!unscale_and_check_(vec![FloatSliceMut::F32(&mut g)], 0.5));
        assert_eq!(g, vec![1.0, 2.0]);
        assert!(unscale_and_check_(
            vec![FloatSliceMut::F32(&mut g), FloatSliceMut::BF16(&mut bad)],
            0.5
        ));
        assert_eq!(bad[0], bf16::from_f32(4.0));
        assert_eq!(clip_coef(2.0, 1.0), 1.0);
    }
}
