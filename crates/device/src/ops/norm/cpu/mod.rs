//! CPU normalisation kernels.
//!
//! Batch norm: the per-channel reductions run one rayon task per channel (each reads its
//! channel's `N` strided blocks of `S` values), then the elementwise pass runs one task per
//! `(n, c)` block with per-channel constants. Layer norm: one task per row; the weight and bias
//! gradients (sums over rows) are accumulated in fixed blocks of `ROW_BLOCK` rows whose
//! partial sums are added in block order, so results do not depend on the thread count.
//! Reductions accumulate in `f64`.
//!
//! The batch-norm kernels read and write their tensor-shaped buffers (input, output, output and
//! input gradients) as a [`NormElement`] of the compute type `T`: `T` itself, or f16/bf16 with
//! `T = f32`, widened per element as it is read and rounded once as it is written, so a 16-bit
//! tensor is never copied to f32 as a whole. The per-channel vectors (weight, bias, statistics,
//! weight/bias gradients) are `T`.
//!
//! [`super::NormOps`] for host buffers (the dtype dispatch over these kernels) is in `cpu/seam.rs`.

mod layer_rows;
mod seam;

use rayon::prelude::*;

use super::{
    Affine, BatchNormShape, LayerNormShape, NormGrads, RunningStats, RunningStatsUpdate,
    SavedStats, SavedStatsMut,
};
use crate::ops::kernel_error::{check_len, KernelError};
use crate::ops::par;
use crate::ops::KernelFloat;
use crate::Element;
use half::{bf16, f16};

/// An element of the tensors batch norm reads and writes, computed in `T`: `T` itself, or a
/// 16-bit float computed in `f32`.
pub trait NormElement<T>: Copy + Send + Sync {
    /// The value in the compute type (exact).
    fn widen(self) -> T;
    /// `v` rounded to this type (round to nearest even, as `to_dtype` rounds).
    fn narrow(v: T) -> Self;
}

impl<T: KernelFloat> NormElement<T> for T {
    fn widen(self) -> T {
        self
    }
    fn narrow(v: T) -> T {
        v
    }
}

macro_rules! half_norm_element {
    ($t:ty) => {
        impl NormElement<f32> for $t {
            fn widen(self) -> f32 {
                self.to_f32()
            }
            fn narrow(v: f32) -> Self {
                <$t as Element>::from_f64(f64::from(v))
            }
        }
    };
}
half_norm_element!(f16);
half_norm_element!(bf16);

/// Rows per partial sum in the layer-norm parameter gradients.
const ROW_BLOCK: usize = 32;

/// Checks optional weight/bias lengths against `[features]`.
fn check_affine<T>(
    op: &'static str,
    affine: &Affine<'_, T>,
    features: usize,
) -> Result<(), KernelError> {
    if let Some(w) = affine.weight {
        check_len(op, "weight", w, &[features])?;
    }
    if let Some(b) = affine.bias {
        check_len(op, "bias", b, &[features])?;
    }
    Ok(())
}

/// Checks the optional gradient buffers of a backward call.
fn check_grads<T, X>(
    op: &'static str,
    grads: &NormGrads<'_, T, X>,
    input_shape: &[usize],
    features: usize,
) -> Result<(), KernelError> {
    if let Some(g) = grads.input.as_deref() {
        check_len(op, "grad_input", g, input_shape)?;
    }
    if let Some(g) = grads.weight.as_deref() {
        check_len(op, "grad_weight", g, &[features])?;
    }
    if let Some(g) = grads.bias.as_deref() {
        check_len(op, "grad_bias", g, &[features])?;
    }
    Ok(())
}

/// Lanes of the blocked sums below: independent partial sums, so the adds of a long sum
/// pipeline (and vectorise) instead of each waiting on the one before.
const LANES: usize = 8;

/// `Σ f(v)` over `values` in `f64`, as [`LANES`] partial sums added in a fixed order at the end
/// (the result depends only on the values and their order).
fn blocked_sum<X: Copy>(values: &[X], f: impl Fn(X) -> f64) -> f64 {
    let mut acc = [0.0f64; LANES];
    let mut chunks = values.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a += f(v);
        }
    }
    let tail: f64 = chunks.remainder().iter().map(|&v| f(v)).sum();
    let [a0, a1, a2, a3, a4, a5, a6, a7] = acc;
    ((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7)) + tail
}

/// `(Σ f(a, b).0, Σ f(a, b).1)` over two equally long slices, blocked like [`blocked_sum`].
fn blocked_sum2<X: Copy>(a: &[X], b: &[X], f: impl Fn(X, X) -> (f64, f64)) -> (f64, f64) {
    let (mut s0, mut s1) = ([0.0f64; LANES], [0.0f64; LANES]);
    let (mut ca, mut cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    for (x, y) in (&mut ca).zip(&mut cb) {
        for i in 0..LANES {
            let (p, q) = f(x[i], y[i]);
            s0[i] += p;
            s1[i] += q;
        }
    }
    let (mut t0, mut t1) = (0.0, 0.0);
    for (&x, &y) in ca.remainder().iter().zip(cb.remainder()) {
        let (p, q) = f(x, y);
        t0 += p;
        t1 += q;
    }
    let fold = |s: [f64; LANES]| ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    (fold(s0) + t0, fold(s1) + t1)
}

/// The `N` blocks of `S` values that belong to channel `c`.
fn channel_blocks<'a, T>(
    data: &'a [T],
    shape: &BatchNormShape,
    c: usize,
) -> impl Iterator<Item = &'a [T]> + 'a {
    let [batch, channels, spatial] = shape.dims();
    (0..batch).map(move |n| &data[(n * channels + c) * spatial..][..spatial])
}

/// Writes `output = input * scale[c] + shift[c]` blockwise (computed in `T`, rounded once).
fn scale_shift<T: KernelFloat, X: NormElement<T>>(
    shape: &BatchNormShape,
    input: &[X],
    scale_shift: &[(T, T)],
    output: &mut [X],
) {
    if output.is_empty() {
        return;
    }
    par::chunks_mut(output, shape.spatial, &|block, out| {
        let (scale, shift) = scale_shift[block % shape.channels];
        let inp = &input[block * shape.spatial..][..out.len()];
        for (o, &x) in out.iter_mut().zip(inp) {
            *o = X::narrow(x.widen() * scale + shift);
        }
    });
}

/// The per-channel `(scale, shift)` that normalises with `mean`/`rstd` and applies `affine`.
fn affine_coefficients<T: KernelFloat>(
    affine: &Affine<'_, T>,
    c: usize,
    mean: f64,
    rstd: f64,
) -> (T, T) {
    let w = affine.weight.map_or(1.0, |w| w[c].to_f64());
    let b = affine.bias.map_or(0.0, |b| b[c].to_f64());
    let scale = w * rstd;
    (T::from_f64(scale), T::from_f64(b - mean * scale))
}

/// Batch norm in training mode: normalises with batch statistics, saves `mean`/`rstd` (`[C]`)
/// for backward, and updates the running statistics if given.
///
/// Shapes: `input` and `output` `[N, C, S]`, weight/bias and statistics `[C]`. Fewer than two
/// values per channel is [`KernelError::TooFewValuesPerChannel`].
pub fn batch_norm_train_forward<T: KernelFloat, X: NormElement<T>>(
    shape: &BatchNormShape,
    input: &[X],
    affine: Affine<'_, T>,
    running: Option<RunningStatsUpdate<'_, T>>,
    eps: f64,
    output: &mut [X],
    saved: SavedStatsMut<'_, T>,
) -> Result<(), KernelError> {
    const OP: &str = "batch_norm";
    let channels = shape.channels;
    check_len(OP, "input", input, &shape.dims())?;
    check_len(OP, "output", output, &shape.dims())?;
    check_affine(OP, &affine, channels)?;
    check_len(OP, "save_mean", saved.mean, &[channels])?;
    check_len(OP, "save_rstd", saved.rstd, &[channels])?;
    if let Some(r) = &running {
        check_len(OP, "running_mean", r.mean, &[channels])?;
        check_len(OP, "running_var", r.var, &[channels])?;
    }
    let count = shape.count();
    if count < 2 && channels > 0 {
        return Err(KernelError::TooFewValuesPerChannel { op: OP, count });
    }
    let n = count as f64;
    // (mean, biased variance) per channel.
    let stats: Vec<(f64, f64)> = par::map(channels, &|c| {
        let sum: f64 = channel_blocks(input, shape, c)
            .map(|b| blocked_sum(b, |v| v.widen().to_f64()))
            .sum();
        let mean = sum / n;
        let squares: f64 = channel_blocks(input, shape, c)
            .map(|b| blocked_sum(b, |v| (v.widen().to_f64() - mean).powi(2)))
            .sum();
        (mean, squares / n)
    });
    let mut coefficients = Vec::with_capacity(channels);
    for (c, &(mean, var)) in stats.iter().enumerate() {
        let rstd = 1.0 / (var + eps).sqrt();
        saved.mean[c] = T::from_f64(mean);
        saved.rstd[c] = T::from_f64(rstd);
        coefficients.push(affine_coefficients(&affine, c, mean, rstd));
    }
    if let Some(running) = running {
        let m = running.momentum;
        for (c, &(mean, var)) in stats.iter().enumerate() {
            let unbiased = var * n / (n - 1.0);
            running.mean[c] = T::from_f64((1.0 - m) * running.mean[c].to_f64() + m * mean);
            running.var[c] = T::from_f64((1.0 - m) * running.var[c].to_f64() + m * unbiased);
        }
    }
    scale_shift(shape, input, &coefficients, output);
    Ok(())
}

/// Batch norm in evaluation mode: normalises with the running statistics.
///
/// Shapes: `input` and `output` `[N, C, S]`, weight/bias and statistics `[C]`.
pub fn batch_norm_eval_forward<T: KernelFloat, X: NormElement<T>>(
    shape: &BatchNormShape,
    input: &[X],
    affine: Affine<'_, T>,
    running: RunningStats<'_, T>,
    eps: f64,
    output: &mut [X],
) -> Result<(), KernelError> {
    const OP: &str = "batch_norm";
    let channels = shape.channels;
    check_len(OP, "input", input, &shape.dims())?;
    check_len(OP, "output", output, &shape.dims())?;
    check_affine(OP, &affine, channels)?;
    check_len(OP, "running_mean", running.mean, &[channels])?;
    check_len(OP, "running_var", running.var, &[channels])?;
    let coefficients: Vec<(T, T)> = (0..channels)
        .map(|c| {
            let rstd = 1.0 / (running.var[c].to_f64() + eps).sqrt();
            affine_coefficients(&affine, c, running.mean[c].to_f64(), rstd)
        })
        .collect();
    scale_shift(shape, input, &coefficients, output);
    Ok(())
}

/// Shared batch-norm backward. `training` selects whether the statistics depend on the input
/// (batch statistics) or are constants (running statistics).
#[allow(clippy::too_many_arguments)]
fn batch_norm_backward<T: KernelFloat, X: NormElement<T>>(
    shape: &BatchNormShape,
    grad_output: &[X],
    input: &[X],
    weight: Option<&[T]>,
    mean: &[f64],
    rstd: &[f64],
    training: bool,
    grads: NormGrads<'_, T, X>,
) {
    let channels = shape.channels;
    let n = shape.count() as f64;
    // (Σ dy, Σ dy * (x - mean)) per channel.
    let sums: Vec<(f64, f64)> = par::map(channels, &|c| {
        let mut sum_dy = 0.0;
        let mut sum_dy_xmu = 0.0;
        for (dy, x) in channel_blocks(grad_output, shape, c).zip(channel_blocks(input, shape, c)) {
            let (s, sx) = blocked_sum2(dy, x, |dy, x| {
                let dy = dy.widen().to_f64();
                (dy, dy * (x.widen().to_f64() - mean[c]))
            });
            sum_dy += s;
            sum_dy_xmu += sx;
        }
        (sum_dy, sum_dy_xmu)
    });
    if let Some(gw) = grads.weight {
        for (c, g) in gw.iter_mut().enumerate() {
            *g = T::from_f64(sums[c].1 * rstd[c]);
        }
    }
    if let Some(gb) = grads.bias {
        for (c, g) in gb.iter_mut().enumerate() {
            *g = T::from_f64(sums[c].0);
        }
    }
    let Some(gin) = grads.input else { return };
    if gin.is_empty() {
        return;
    }
    // dx = w * rstd * (dy - Σdy / n - (x - mean) * rstd² * Σdy(x - mean) / n) in training,
    // dx = w * rstd * dy in evaluation; as dx = dy * a + x * b + k per channel.
    let coefficients: Vec<(T, T, T)> = (0..channels)
        .map(|c| {
            let w = weight.map_or(1.0, |w| w[c].to_f64());
            let a = w * rstd[c];
            if training {
                let proj = rstd[c] * rstd[c] * sums[c].1 / n;
                let k = a * (mean[c] * proj - sums[c].0 / n);
                (T::from_f64(a), T::from_f64(-a * proj), T::from_f64(k))
            } else {
                (T::from_f64(a), T::ZERO, T::ZERO)
            }
        })
        .collect();
    par::chunks_mut(gin, shape.spatial, &|block, gin| {
        let (a, b, k) = coefficients[block % channels];
        let start = block * shape.spatial;
        let dy = &grad_output[start..][..shape.spatial];
        let x = &input[start..][..shape.spatial];
        for ((g, &dy), &x) in gin.iter_mut().zip(dy).zip(x) {
            *g = X::narrow(dy.widen() * a + x.widen() * b + k);
        }
    });
}

/// Gradients of [`batch_norm_train_forward`] from its saved statistics.
///
/// Shapes: `grad_output`, `input` and `grads.input` `[N, C, S]`; `weight`, `saved` and the
/// parameter gradients `[C]`.
pub fn batch_norm_train_backward<T: KernelFloat, X: NormElement<T>>(
    shape: &BatchNormShape,
    grad_output: &[X],
    input: &[X],
    weight: Option<&[T]>,
    saved: SavedStats<'_, T>,
    grads: NormGrads<'_, T, X>,
) -> Result<(), KernelError> {
    const OP: &str = "batch_norm_backward";
    let channels = shape.channels;
    check_len(OP, "grad_output", grad_output, &shape.dims())?;
    check_len(OP, "input", input, &shape.dims())?;
    if let Some(w) = weight {
        check_len(OP, "weight", w, &[channels])?;
    }
    check_len(OP, "save_mean", saved.mean, &[channels])?;
    check_len(OP, "save_rstd", saved.rstd, &[channels])?;
    check_grads(OP, &grads, &shape.dims(), channels)?;
    let mean: Vec<f64> = saved.mean.iter().map(|v| v.to_f64()).collect();
    let rstd: Vec<f64> = saved.rstd.iter().map(|v| v.to_f64()).collect();
    batch_norm_backward(shape, grad_output, input, weight, &mean, &rstd, true, grads);
    Ok(())
}

/// Gradients of [`batch_norm_eval_forward`] (the running statistics are constants).
///
/// Shapes: `grad_output`, `input` and `grads.input` `[N, C, S]`; `weight`, `running` and the
/// parameter gradients `[C]`.
pub fn batch_norm_eval_backward<T: KernelFloat, X: NormElement<T>>(
    shape: &BatchNormShape,
    grad_output: &[X],
    input: &[X],
    weight: Option<&[T]>,
    running: RunningStats<'_, T>,
    eps: f64,
    grads: NormGrads<'_, T, X>,
) -> Result<(), KernelError> {
    const OP: &str = "batch_norm_backward";
    let channels = shape.channels;
    check_len(OP, "grad_output", grad_output, &shape.dims())?;
    check_len(OP, "input", input, &shape.dims())?;
    if let Some(w) = weight {
        check_len(OP, "weight", w, &[channels])?;
    }
    check_len(OP, "running_mean", running.mean, &[channels])?;
    check_len(OP, "running_var", running.var, &[channels])?;
    check_grads(OP, &grads, &shape.dims(), channels)?;
    let mean: Vec<f64> = running.mean.iter().map(|v| v.to_f64()).collect();
    let rstd: Vec<f64> = running
        .var
        .iter()
        .map(|v| 1.0 / (v.to_f64() + eps).sqrt())
        .collect();
    batch_norm_backward(
        shape,
        grad_output,
        input,
        weight,
        &mean,
        &rstd,
        false,
        grads,
    );
    Ok(())
}

/// Layer norm: normalises each row of `[rows, cols]`, applies the optional elementwise
/// affine (`[cols]`), and saves per-row `mean`/`rstd` (`[rows]`).
pub fn layer_norm_forward<T: KernelFloat>(
    shape: &LayerNormShape,
    input: &[T],
    affine: Affine<'_, T>,
    eps: f64,
    output: &mut [T],
    saved: SavedStatsMut<'_, T>,
) -> Result<(), KernelError> {
    const OP: &str = "layer_norm";
    let dims = [shape.rows, shape.cols];
    check_len(OP, "input", input, &dims)?;
    check_len(OP, "output", output, &dims)?;
    check_affine(OP, &affine, shape.cols)?;
    check_len(OP, "mean", saved.mean, &[shape.rows])?;
    check_len(OP, "rstd", saved.rstd, &[shape.rows])?;
    if output.is_empty() {
        return Ok(());
    }
    let n = shape.cols as f64;
    output
        .par_chunks_mut(shape.cols)
        .zip(input.par_chunks(shape.cols))
        .zip(saved.mean.par_iter_mut().zip(saved.rstd.par_iter_mut()))
        .for_each(|((out, x), (mean_out, rstd_out))| {
            let mean = x.iter().map(|v| v.to_f64()).sum::<f64>() / n;
            let var = x.iter().map(|v| (v.to_f64() - mean).powi(2)).sum::<f64>() / n;
            let rstd = 1.0 / (var + eps).sqrt();
            *mean_out = T::from_f64(mean);
            *rstd_out = T::from_f64(rstd);
            let (mean, rstd) = (T::from_f64(mean), T::from_f64(rstd));
            for (j, (o, &x)) in out.iter_mut().zip(x).enumerate() {
                let mut y = (x - mean) * rstd;
                if let Some(w) = affine.weight {
                    y *= w[j];
                }
                if let Some(b) = affine.bias {
                    y += b[j];
                }
                *o = y;
            }
        });
    Ok(())
}

/// Gradients of [`layer_norm_forward`] from its saved statistics.
///
/// Shapes: `grad_output`, `input` and `grads.input` `[rows, cols]`; `weight` and the parameter
/// gradients `[cols]`; `saved` `[rows]`.
pub fn layer_norm_backward<T: KernelFloat>(
    shape: &LayerNormShape,
    grad_output: &[T],
    input: &[T],
    weight: Option<&[T]>,
    saved: SavedStats<'_, T>,
    grads: NormGrads<'_, T>,
) -> Result<(), KernelError> {
    const OP: &str = "layer_norm_backward";
    let dims = [shape.rows, shape.cols];
    let cols = shape.cols;
    check_len(OP, "grad_output", grad_output, &dims)?;
    check_len(OP, "input", input, &dims)?;
    if let Some(w) = weight {
        check_len(OP, "weight", w, &[cols])?;
    }
    check_len(OP, "mean", saved.mean, &[shape.rows])?;
    check_len(OP, "rstd", saved.rstd, &[shape.rows])?;
    check_grads(OP, &grads, &dims, cols)?;
    if cols == 0 {
        return Ok(());
    }
    let isa = crate::ops::simd::isa();
    let stats = |row: usize| [saved.mean[row].to_f64(), saved.rstd[row].to_f64()];
    if let Some(gin) = grads.input {
        // A norm without weight scales by ones.
        let ones;
        let w = match weight {
            Some(w) => w,
            None => {
                ones = vec![T::ONE; cols];
                &ones
            }
        };
        par::chunks_mut(gin, cols, &|row, gin| {
            let (dy, x) = (
                &grad_output[row * cols..][..cols],
                &input[row * cols..][..cols],
            );
            layer_rows::input_grad_row(isa, dy, x, w, stats(row), gin);
        });
    }
    if grads.weight.is_none() && grads.bias.is_none() {
        return Ok(());
    }
    // Per block of rows: Σ dy * xhat (weight) then Σ dy (bias), per column.
    let partials: Vec<Vec<f64>> = par::map(shape.rows.div_ceil(ROW_BLOCK), &|block| {
        let rows = block * ROW_BLOCK..((block + 1) * ROW_BLOCK).min(shape.rows);
        let block_stats: Vec<[f64; 2]> = rows.clone().map(stats).collect();
        let span = rows.start * cols..rows.end * cols;
        let mut acc = vec![0.0; 2 * cols];
        let (dy, x) = (&grad_output[span.clone()], &input[span]);
        layer_rows::param_grads_rows(isa, dy, x, &block_stats, &mut acc);
        acc
    });
    let mut totals = vec![0.0; 2 * cols];
    for partial in partials {
        totals.iter_mut().zip(partial).for_each(|(t, p)| *t += p);
    }
    if let Some(gw) = grads.weight {
        gw.iter_mut()
            .zip(&totals[..cols])
            .for_each(|(g, &t)| *g = T::from_f64(t));
    }
    if let Some(gb) = grads.bias {
        gb.iter_mut()
            .zip(&totals[cols..])
            .for_each(|(g, &t)| *g = T::from_f64(t));
    }
    Ok(())
}
