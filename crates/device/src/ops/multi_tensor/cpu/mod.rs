//! The CPU implementation of the multi-tensor family ([`MultiTensorOps`] for [`CpuStorage`]):
//! a rayon pass over fixed chunks of a tensor list (see the module docs in `mod.rs` for the
//! chunking and determinism rules). The optimizer steps live in `cpu/adam.rs` and `cpu/sgd.rs`,
//! the typed views of host buffers in `cpu/slices.rs`.
//!
//! Invariants: the kernel functions here run on the rayon pool they are called from; the trait
//! methods install kiln's pool ([`crate::threads::cpu_pool`]); results never depend on that
//! pool's size. Reductions read a chunk with eight independent `f64` accumulators (so the loop
//! vectorises and rounding error stays small; `f32` 1- and 2-norms use [`sum_f32_blocked`]
//! instead), combine them in a fixed tree, then combine chunks of a tensor in plan order on one
//! thread. Small chunks are batched into tasks of at least `CHUNK_ELEMS` elements
//! ([`batch_ranges`]). The `f32` loops of the norms, maps and steps are also compiled for
//! AVX-512 and AVX2 (`ops/simd.rs`: kiln builds for 128-bit SSE) and give the same bits on
//! every path, which the tests check on each instruction set the CPU has.

mod adam;
mod sgd;
mod slices;
mod tasks;

pub use slices::{FloatSlice, FloatSliceMut};
use tasks::into_tasks;

use super::{
    batch_ranges, clip_coef, plan_chunks, AdamHyper, AdamOperands, Chunk, HostNorm, MultiTensorOps,
    NormKind, Operand, OperandMut, SgdHyper, SgdOperands, CHUNK_ELEMS,
};
use crate::ops::simd::{self, simd_dispatch};
use crate::{CpuStorage, DType, Element, Error, Result};
use half::{bf16, f16};
use rayon::prelude::*;

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
                let $x = block[i].to_f64();
                lanes[i] = $step;
            }
        }
        for (i, v) in blocks.remainder().iter().enumerate() {
            let $acc = lanes[i];
            let $x = v.to_f64();
            lanes[i] = $step;
        }
        lanes
    }};
}

/// The reduced value (sum of `|x|^p`, max/min of `|x|`, or nonzero count) of one slice.
pub fn reduce_slice<T: Element>(s: &[T], kind: NormKind) -> f64 {
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

/// `f32` lanes of [`sum_f32_blocked`]: four AVX-512 registers, eight AVX2 ones.
const SUM_LANES: usize = 64;

/// Elements per sub-block of [`sum_f32_blocked`]: 64 lanes of 16 values each, so an `f32` lane
/// never sums more than 16 terms before it is added into the `f64` total.
const SUB_BLOCK: usize = SUM_LANES * 16;

/// Sum of `x*x` (`SQUARE`) or `|x|` of `f32` data: 64 `f32` lanes over sub-blocks of 1,024
/// elements, each sub-block's lanes folded into eight `f64` sums (lane `i` into sum `i % 8`,
/// in lane order) and those added in a fixed tree. A sub-block's last partial row (all of a
/// slice shorter than 64 elements) is padded with zeros to a full row: adding a term of zero to
/// a sum changes no bit (the sums start at `+0` and every term is `+0` or more, or NaN).
#[inline(always)]
fn sum_f32_body<const SQUARE: bool>(s: &[f32]) -> f64 {
    let term = |x: f32| if SQUARE { x * x } else { x.abs() };
    let tree = |f: [f64; 8]| ((f[0] + f[1]) + (f[2] + f[3])) + ((f[4] + f[5]) + (f[6] + f[7]));
    let mut total = 0f64;
    for block in s.chunks(SUB_BLOCK) {
        let mut acc = [0f32; SUM_LANES];
        let mut rows = block.chunks_exact(SUM_LANES);
        for row in &mut rows {
            for i in 0..SUM_LANES {
                acc[i] += term(row[i]);
            }
        }
        // The partial row as one full vector row (a scalar loop over it through the stack
        // cost as much as the full rows of a 1,000-element gradient, and a slice of a few
        // dozen elements sums faster this way than in a scalar fold).
        let rest = rows.remainder();
        if !rest.is_empty() {
            let mut row = [0f32; SUM_LANES];
            row[..rest.len()].copy_from_slice(rest);
            for i in 0..SUM_LANES {
                acc[i] += term(row[i]);
            }
        }
        // Row by row of eight lanes: the same additions, in the same order, as lane `i` into
        // sum `i % 8`, written so that each row is one vector add.
        let mut folded = [0f64; 8];
        for row in acc.chunks_exact(8) {
            for k in 0..8 {
                folded[k] += f64::from(row[k]);
            }
        }
        total += tree(folded);
    }
    total
}

simd_dispatch! {
    /// [`sum_f32_body`] in the widest vector instructions the CPU has (`simd.rs`): the same
    /// multiplies and adds in the same order on every path, so the same bits.
    fn sum_f32_lanes[const SQUARE: bool](s: &[f32]) -> f64 => sum_f32_body[SQUARE];
}

/// Sum of `x*x` (`square`) or `|x|` of `f32` data at full SIMD width (see [`sum_f32_body`]):
/// the partial sums of the `f32` 2- and 1-norms.
pub fn sum_f32_blocked(s: &[f32], square: bool) -> f64 {
    let isa = simd::isa();
    if square {
        sum_f32_lanes::<true>(isa, s)
    } else {
        sum_f32_lanes::<false>(isa, s)
    }
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

/// Splits every tensor into chunks and batches small chunks into tasks of at least
/// `CHUNK_ELEMS` elements, for one parallel pass.
fn chunks_of<'a>(tensors: Vec<FloatSliceMut<'a>>) -> Vec<Vec<FloatSliceMut<'a>>> {
    let mut chunks: Vec<FloatSliceMut<'a>> = Vec::with_capacity(tensors.len());
    for t in tensors {
        // A tensor of one chunk is pushed as it is (no vector per small tensor).
        if t.len() <= CHUNK_ELEMS {
            chunks.push(t);
        } else {
            chunks.extend(t.into_chunks(CHUNK_ELEMS));
        }
    }
    into_tasks(chunks, FloatSliceMut::len)
}

/// An elementwise map of [`map_all`], in `f32` and in `f64`. A trait with `#[inline(always)]`
/// methods rather than closures: closures passed down through rayon stayed calls per element.
trait ElementMap: Sync {
    fn f32(&self, x: f32) -> f32;
    fn f64(&self, x: f64) -> f64;
}

/// Multiplies by a coefficient (rounded to `f32` for the `f32` map).
struct Scale(f32, f64);

impl ElementMap for Scale {
    #[inline(always)]
    fn f32(&self, x: f32) -> f32 {
        x * self.0
    }
    #[inline(always)]
    fn f64(&self, x: f64) -> f64 {
        x * self.1
    }
}

/// Clamps to `[-limit, limit]`, NaN staying NaN.
struct Clamp(f32, f64);

impl ElementMap for Clamp {
    #[inline(always)]
    fn f32(&self, x: f32) -> f32 {
        if x.is_nan() {
            x
        } else {
            x.max(-self.0).min(self.0)
        }
    }
    #[inline(always)]
    fn f64(&self, x: f64) -> f64 {
        if x.is_nan() {
            x
        } else {
            x.max(-self.1).min(self.1)
        }
    }
}

/// One `f32` chunk of [`map_all`].
#[inline(always)]
fn map_f32_body<M: ElementMap>(map: &M, s: &mut [f32]) {
    s.iter_mut().for_each(|x| *x = map.f32(*x));
}

simd_dispatch! {
    /// [`map_f32_body`] in the widest vector instructions the CPU has: the map is one
    /// operation per element, so every path gives the same bits.
    fn map_f32[M: ElementMap](map: &M, s: &mut [f32]) => map_f32_body[M];
}

/// Applies `map` to every element of every tensor, in parallel over chunks. Half types go
/// through the `f32` map (widened, mapped, rounded once).
fn map_all(tensors: Vec<FloatSliceMut<'_>>, map: &impl ElementMap) {
    let isa = simd::isa();
    chunks_of(tensors)
        .into_par_iter()
        .flatten_iter()
        .for_each(|c| match c {
            FloatSliceMut::F32(s) => map_f32(isa, map, s),
            FloatSliceMut::F64(s) => s.iter_mut().for_each(|x| *x = map.f64(*x)),
            FloatSliceMut::F16(s) => s
                .iter_mut()
                .for_each(|x| *x = f16::from_f32(map.f32(x.to_f32()))),
            FloatSliceMut::BF16(s) => s
                .iter_mut()
                .for_each(|x| *x = bf16::from_f32(map.f32(x.to_f32()))),
        });
}

/// Multiplies every element by `coef` (rounded to `f32` for `f32`/`f16`/`bf16` tensors, as
/// PyTorch multiplies a gradient by a coefficient of its own dtype).
pub fn scale_(tensors: Vec<FloatSliceMut<'_>>, coef: f64) {
    map_all(tensors, &Scale(coef as f32, coef));
}

/// Clamps every element to `[-limit, limit]` (NaN stays NaN), PyTorch's `clip_grad_value_`.
pub fn clamp_(tensors: Vec<FloatSliceMut<'_>>, limit: f64) {
    map_all(tensors, &Clamp(limit as f32, limit));
}

/// AMP's fused unscale: multiplies every element by `inv_scale` (an `f32`, as PyTorch keeps the
/// scale) and reports whether any element is NaN or infinite *after* scaling, as stored, in one
/// pass. That is every element that was non-finite before (`inv_scale` is finite and nonzero)
/// and also a finite one the unscale overflowed (a scale below 1), which PyTorch's check of the
/// input misses and lets the step take as an infinite gradient.
pub fn unscale_and_check_(tensors: Vec<FloatSliceMut<'_>>, inv_scale: f32) -> bool {
    fn run<T: Copy>(s: &mut [T], finite: impl Fn(T) -> bool, f: impl Fn(T) -> T) -> bool {
        let mut bad = false;
        for x in s.iter_mut() {
            *x = f(*x);
            bad |= !finite(*x);
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

/// The per-tensor norms, their total and the clip coefficient for `max_norm`.
fn host_norm(per_tensor: Vec<f64>, kind: NormKind, max_norm: f64) -> HostNorm {
    let total = kind.norm_of(&per_tensor);
    HostNorm {
        per_tensor,
        total,
        coef: clip_coef(max_norm, total),
    }
}

fn views<'a>(op: &'static str, tensors: &[Operand<'a, CpuStorage>]) -> Result<Vec<FloatSlice<'a>>> {
    tensors
        .iter()
        .map(|&t| slices::float_slice(op, t))
        .collect()
}

fn views_mut<'a>(
    op: &'static str,
    tensors: &'a mut [OperandMut<'_, CpuStorage>],
) -> Result<Vec<FloatSliceMut<'a>>> {
    tensors
        .iter_mut()
        .map(|(st, layout)| slices::float_slice_mut(op, (&mut **st, *layout)))
        .collect()
}

fn pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    crate::threads::install(f)
}

/// The dtype every parameter of a step has, if they all have one (`None` for a mixed or empty
/// list).
fn one_param_dtype<'a>(mut params: impl Iterator<Item = &'a CpuStorage>) -> Option<DType> {
    let first = params.next()?.dtype();
    params.all(|st| st.dtype() == first).then_some(first)
}

/// Checks that every parameter of a step is f32 or f64.
fn check_step_dtypes<'a>(
    op: &'static str,
    params: impl Iterator<Item = &'a CpuStorage>,
) -> Result<()> {
    for st in params {
        let dtype = st.dtype();
        if !matches!(dtype, DType::F32 | DType::F64) {
            return Err(Error::UnsupportedDType {
                op,
                dtype,
                hint: "optimizer steps update f32/f64 parameters; keep master weights in f32",
            });
        }
    }
    Ok(())
}

impl MultiTensorOps for CpuStorage {
    type Norm = HostNorm;
    type FoundInf = bool;

    fn per_tensor_norms(
        op: &'static str,
        tensors: &[Operand<'_, Self>],
        kind: NormKind,
    ) -> Result<Vec<f64>> {
        let views = views(op, tensors)?;
        Ok(pool(|| per_tensor_norms(&views, kind)))
    }

    fn global_norm(
        op: &'static str,
        tensors: &[Operand<'_, Self>],
        kind: NormKind,
        max_norm: f64,
    ) -> Result<HostNorm> {
        let per_tensor = Self::per_tensor_norms(op, tensors, kind)?;
        Ok(host_norm(per_tensor, kind, max_norm))
    }

    fn norm_total(norm: &HostNorm) -> Result<f64> {
        Ok(norm.total)
    }

    fn copy_norm_total(op: &'static str, norm: &HostNorm, out: OperandMut<'_, Self>) -> Result<()> {
        let (st, layout) = out;
        let dtype = st.dtype();
        match slices::float_slice_mut(op, (st, layout))? {
            FloatSliceMut::F32(s) if s.len() == 1 => s[0] = norm.total as f32,
            other => {
                return Err(Error::LengthMismatch {
                    op,
                    what: format!(
                        "the total norm is written to a 0-d f32 tensor, got {} elements of {dtype}",
                        other.len()
                    ),
                })
            }
        }
        Ok(())
    }

    fn scale_by_clip_coef_(
        op: &'static str,
        tensors: &mut [OperandMut<'_, Self>],
        norm: &HostNorm,
    ) -> Result<()> {
        if norm.coef >= 1.0 {
            return Ok(());
        }
        Self::scale_(op, tensors, norm.coef)
    }

    /// One set of views for both passes (checking and viewing thousands of small tensors a
    /// second time for the scale pass was a tenth of a clip).
    fn clip_by_global_norm_(
        op: &'static str,
        tensors: &mut [OperandMut<'_, Self>],
        kind: NormKind,
        max_norm: f64,
        refuse_nonfinite: bool,
    ) -> Result<(HostNorm, bool)> {
        let views = views_mut(op, tensors)?;
        let read: Vec<FloatSlice<'_>> = views.iter().map(FloatSliceMut::as_read).collect();
        let norm = host_norm(pool(|| per_tensor_norms(&read, kind)), kind, max_norm);
        drop(read);
        let refused = refuse_nonfinite && !norm.total.is_finite();
        // As `scale_by_clip_coef_`: a coefficient of 1 or more skips, a NaN one scales.
        let skip = refused || norm.coef >= 1.0;
        if !skip {
            pool(|| scale_(views, norm.coef));
        }
        Ok((norm, refused))
    }

    fn scale_(op: &'static str, tensors: &mut [OperandMut<'_, Self>], coef: f64) -> Result<()> {
        let views = views_mut(op, tensors)?;
        pool(|| scale_(views, coef));
        Ok(())
    }

    fn clamp_(op: &'static str, tensors: &mut [OperandMut<'_, Self>], limit: f64) -> Result<()> {
        let views = views_mut(op, tensors)?;
        pool(|| clamp_(views, limit));
        Ok(())
    }

    fn unscale_and_check_(
        op: &'static str,
        tensors: &mut [OperandMut<'_, Self>],
        inv_scale: f32,
    ) -> Result<bool> {
        let views = views_mut(op, tensors)?;
        Ok(pool(|| unscale_and_check_(views, inv_scale)))
    }

    fn read_found_inf(found: &bool) -> Result<bool> {
        Ok(*found)
    }

    fn adam_step(
        op: &'static str,
        list: &mut [AdamOperands<'_, Self>],
        hyper: &AdamHyper,
    ) -> Result<()> {
        // f32 parameters first, then f64, each in one pass (as the list's order within a dtype);
        // a list of one dtype (the usual case) goes as it is, without a copy of its operands.
        if let Some(dtype) = one_param_dtype(list.iter().map(|o| &*o.param.0)) {
            // One dtype for all: checking the first parameter checks them all.
            check_step_dtypes(op, list.iter().take(1).map(|o| &*o.param.0))?;
            return match dtype {
                DType::F64 => adam::adam_pass::<f64>(op, list, hyper),
                _ => adam::adam_pass::<f32>(op, list, hyper),
            };
        }
        let (mut f32s, mut f64s): (Vec<_>, Vec<_>) = list
            .iter_mut()
            .map(|o| AdamOperands {
                param: (&mut *o.param.0, o.param.1),
                grad: o.grad,
                exp_avg: (&mut *o.exp_avg.0, o.exp_avg.1),
                exp_avg_sq: (&mut *o.exp_avg_sq.0, o.exp_avg_sq.1),
                max_exp_avg_sq: o.max_exp_avg_sq.as_mut().map(|(s, l)| (&mut **s, *l)),
                scalars: o.scalars,
            })
            .partition(|o| o.param.0.dtype() != DType::F64);
        check_step_dtypes(op, f32s.iter().map(|o| &*o.param.0))?;
        adam::adam_pass::<f32>(op, &mut f32s, hyper)?;
        adam::adam_pass::<f64>(op, &mut f64s, hyper)
    }

    fn sgd_step(
        op: &'static str,
        list: &mut [SgdOperands<'_, Self>],
        hyper: &SgdHyper,
    ) -> Result<()> {
        if let Some(dtype) = one_param_dtype(list.iter().map(|o| &*o.param.0)) {
            // One dtype for all: checking the first parameter checks them all.
            check_step_dtypes(op, list.iter().take(1).map(|o| &*o.param.0))?;
            return match dtype {
                DType::F64 => sgd::sgd_pass::<f64>(op, list, hyper),
                _ => sgd::sgd_pass::<f32>(op, list, hyper),
            };
        }
        let (mut f32s, mut f64s): (Vec<_>, Vec<_>) = list
            .iter_mut()
            .map(|o| SgdOperands {
                param: (&mut *o.param.0, o.param.1),
                grad: o.grad,
                momentum_buffer: o.momentum_buffer.as_mut().map(|(s, l)| (&mut **s, *l)),
                first_momentum_step: o.first_momentum_step,
            })
            .partition(|o| o.param.0.dtype() != DType::F64);
        check_step_dtypes(op, f32s.iter().map(|o| &*o.param.0))?;
        sgd::sgd_pass::<f32>(op, &mut f32s, hyper)?;
        sgd::sgd_pass::<f64>(op, &mut f64s, hyper)
    }
}

#[cfg(test)]
mod tests;
