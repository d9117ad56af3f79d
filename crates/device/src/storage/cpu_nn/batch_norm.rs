//! The CPU side of the seam's batch-norm methods, over the kernels in `crate::ops::norm::cpu`.
//!
//! Dtypes: f32/f64 run natively; an f16/bf16 call whose per-channel vectors share its dtype
//! runs in f32 and rounds every result back once (`float_kernel!`); and PyTorch's mixed case,
//! a 16-bit input with f32 weight, bias and running statistics (what autocast produces, see
//! [`batch_norm_param_dtype`]), runs in f32 too but rounds only the tensor-shaped results (the
//! output, the input gradient) to the input's dtype: the saved `mean`/`rstd`, the running
//! statistics and the weight/bias gradients stay f32. As with every 16-bit CPU kernel, the
//! 16-bit tensor is widened to an f32 scratch copy first and the f32 result rounded in one more
//! pass; the per-channel vectors are read in place.

use super::{dense, dense_mut, dense_opt, in_pool, norm_grads, wrap, wrap_grads, zeros};
use super::{HostElement, Narrow};
use crate::backend::{BatchNormStats, GradMask, Grads3, RunningStatsMut, Strided};
use crate::dtype::DType;
use crate::ops::norm::{
    batch_norm_param_dtype, cpu as norm, Affine, BatchNormShape, RunningStats, RunningStatsUpdate,
    SavedStats, SavedStatsMut,
};
use crate::ops::KernelFloat;
use crate::storage::cpu::CpuStorage;
use crate::{BackendStorage, Error, Layout, Result};

fn dtype_of(s: &Option<Strided<'_, CpuStorage>>) -> Option<DType> {
    s.map(|s| s.0.dtype())
}

pub(in crate::storage) fn batch_norm_train(
    x: Strided<'_, CpuStorage>,
    weight: Option<Strided<'_, CpuStorage>>,
    bias: Option<Strided<'_, CpuStorage>>,
    running: Option<RunningStatsMut<'_, CpuStorage>>,
    eps: f64,
) -> Result<[CpuStorage; 3]> {
    const OP: &str = "batch_norm";
    let shape = BatchNormShape::from_input_shape(x.1.shape())?;
    let dtype = x.0.dtype();
    let (rm, rv) = (
        running.as_ref().map(|r| r.mean.0.dtype()),
        running.as_ref().map(|r| r.var.0.dtype()),
    );
    let params = batch_norm_param_dtype(OP, dtype, [dtype_of(&weight), dtype_of(&bias), rm, rv])?;
    if params != dtype {
        // Mixed: a 16-bit input with f32 vectors. Only the output is rounded to the input dtype.
        let [out, mean, rstd] = train_in::<f32>(x, weight, bias, running, eps, &shape)?;
        return Ok([out.narrow(dtype)?, mean, rstd]);
    }
    match running {
        Some(r) if matches!(dtype, DType::F16 | DType::BF16) => {
            // Half running statistics: update f32 copies, then round them back in place.
            let mut mean = r.mean.0.to_dtype(r.mean.1, DType::F32)?;
            let mut var = r.var.0.to_dtype(r.var.1, DType::F32)?;
            let c = Layout::contiguous(r.mean.1.shape());
            let wide = RunningStatsMut {
                mean: (&mut mean, &c),
                var: (&mut var, &c),
                momentum: r.momentum,
            };
            let out = float_kernel!(OP, dtype, T => train_in::<T>(x, weight, bias, Some(wide), eps, &shape))?;
            mean.to_dtype(&c, dtype)?
                .copy_into(&c, r.mean.0, r.mean.1)?;
            var.to_dtype(&c, dtype)?.copy_into(&c, r.var.0, r.var.1)?;
            Ok(out)
        }
        running => {
            float_kernel!(OP, dtype, T => train_in::<T>(x, weight, bias, running, eps, &shape))
        }
    }
}

/// Training forward with every float operand read as `T` (16-bit ones widened).
fn train_in<T: HostElement + KernelFloat>(
    x: Strided<'_, CpuStorage>,
    weight: Option<Strided<'_, CpuStorage>>,
    bias: Option<Strided<'_, CpuStorage>>,
    running: Option<RunningStatsMut<'_, CpuStorage>>,
    eps: f64,
    shape: &BatchNormShape,
) -> Result<[CpuStorage; 3]> {
    const OP: &str = "batch_norm";
    let shape = *shape;
    let input = dense::<T>(OP, x)?;
    let (w, b) = (dense_opt::<T>(OP, weight)?, dense_opt::<T>(OP, bias)?);
    let running = match running {
        None => None,
        Some(r) => Some(RunningStatsUpdate {
            mean: dense_mut::<T>(OP, (r.mean.0, r.mean.1))?,
            var: dense_mut::<T>(OP, (r.var.0, r.var.1))?,
            momentum: r.momentum,
        }),
    };
    let mut out = zeros::<T>(&shape.dims())?;
    let c = [shape.channels];
    let (mut mean, mut rstd) = (zeros::<T>(&c)?, zeros::<T>(&c)?);
    let affine = Affine {
        weight: w.as_deref(),
        bias: b.as_deref(),
    };
    let saved = SavedStatsMut {
        mean: &mut mean,
        rstd: &mut rstd,
    };
    in_pool(|| {
        norm::batch_norm_train_forward(&shape, &input, affine, running, eps, &mut out, saved)
    })?;
    Ok([wrap(out), wrap(mean), wrap(rstd)])
}

pub(in crate::storage) fn batch_norm_eval(
    x: Strided<'_, CpuStorage>,
    weight: Option<Strided<'_, CpuStorage>>,
    bias: Option<Strided<'_, CpuStorage>>,
    running: [Strided<'_, CpuStorage>; 2],
    eps: f64,
) -> Result<CpuStorage> {
    const OP: &str = "batch_norm";
    let shape = BatchNormShape::from_input_shape(x.1.shape())?;
    let dtype = x.0.dtype();
    let stats = running.map(|r| Some(r.0.dtype()));
    batch_norm_param_dtype(
        OP,
        dtype,
        [dtype_of(&weight), dtype_of(&bias), stats[0], stats[1]],
    )?;
    // Mixed or not, the one result is rounded to the input dtype.
    float_kernel!(OP, dtype, T => {
        let input = dense::<T>(OP, x)?;
        let (w, b) = (dense_opt::<T>(OP, weight)?, dense_opt::<T>(OP, bias)?);
        let (mean, var) = (dense::<T>(OP, running[0])?, dense::<T>(OP, running[1])?);
        let mut out = zeros::<T>(&shape.dims())?;
        let affine = Affine { weight: w.as_deref(), bias: b.as_deref() };
        let stats = RunningStats { mean: &mean, var: &var };
        in_pool(|| norm::batch_norm_eval_forward(&shape, &input, affine, stats, eps, &mut out))?;
        Ok(wrap(out))
    })
}

pub(in crate::storage) fn batch_norm_backward(
    grad: Strided<'_, CpuStorage>,
    x: Strided<'_, CpuStorage>,
    weight: Option<Strided<'_, CpuStorage>>,
    stats: BatchNormStats<'_, CpuStorage>,
    mask: GradMask,
) -> Result<Grads3<CpuStorage>> {
    const OP: &str = "batch_norm_backward";
    let dtype = grad.0.dtype();
    if x.0.dtype() != dtype {
        return Err(Error::DTypeMismatch {
            op: OP,
            lhs: dtype,
            rhs: x.0.dtype(),
        });
    }
    let [s0, s1] = match stats {
        BatchNormStats::Batch { mean, rstd } => [mean, rstd],
        BatchNormStats::Running { mean, var, .. } => [mean, var],
    }
    .map(|s| Some(s.0.dtype()));
    let params = batch_norm_param_dtype(OP, dtype, [dtype_of(&weight), s0, s1])?;
    if params != dtype {
        // Mixed: the input gradient in the input's dtype, the parameter gradients in f32.
        let [gi, gw, gb] = backward_in::<f32>(grad, x, weight, stats, mask)?;
        return Ok([gi.narrow(dtype)?, gw, gb]);
    }
    float_kernel!(OP, dtype, T => backward_in::<T>(grad, x, weight, stats, mask))
}

/// Backward with every float operand read as `T` (16-bit ones widened).
fn backward_in<T: HostElement + KernelFloat>(
    grad: Strided<'_, CpuStorage>,
    x: Strided<'_, CpuStorage>,
    weight: Option<Strided<'_, CpuStorage>>,
    stats: BatchNormStats<'_, CpuStorage>,
    mask: GradMask,
) -> Result<Grads3<CpuStorage>> {
    const OP: &str = "batch_norm_backward";
    let shape = BatchNormShape::from_input_shape(x.1.shape())?;
    let (go, input) = (dense::<T>(OP, grad)?, dense::<T>(OP, x)?);
    let w = dense_opt::<T>(OP, weight)?;
    let c = shape.channels;
    let mut slots = [
        zeros::<T>(&[if mask[0] {
            shape.dims().iter().product()
        } else {
            0
        }])?,
        zeros::<T>(&[if mask[1] { c } else { 0 }])?,
        zeros::<T>(&[if mask[2] { c } else { 0 }])?,
    ];
    let grads = norm_grads(mask, &mut slots);
    match stats {
        BatchNormStats::Batch { mean, rstd } => {
            let (mean, rstd) = (dense::<T>(OP, mean)?, dense::<T>(OP, rstd)?);
            let saved = SavedStats {
                mean: &mean,
                rstd: &rstd,
            };
            in_pool(|| {
                norm::batch_norm_train_backward(&shape, &go, &input, w.as_deref(), saved, grads)
            })?;
        }
        BatchNormStats::Running { mean, var, eps } => {
            let (mean, var) = (dense::<T>(OP, mean)?, dense::<T>(OP, var)?);
            let running = RunningStats {
                mean: &mean,
                var: &var,
            };
            in_pool(|| {
                norm::batch_norm_eval_backward(
                    &shape,
                    &go,
                    &input,
                    w.as_deref(),
                    running,
                    eps,
                    grads,
                )
            })?;
        }
    }
    Ok(wrap_grads(mask, slots))
}
