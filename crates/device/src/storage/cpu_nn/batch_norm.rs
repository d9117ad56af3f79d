//! The CPU side of the seam's batch-norm methods, over the kernels in `crate::ops::norm::cpu`.
//!
//! Dtypes: f32/f64 run natively. An f16/bf16 input runs the kernels with `T = f32` on the
//! 16-bit tensors themselves (each element widened as it is read, each result rounded once as
//! it is written: no f32 copy of the tensor), with the per-channel vectors in f32 (16-bit ones
//! are widened, a `[C]` copy). Which dtype those vectors come back in follows
//! [`batch_norm_param_dtype`]: when weight, bias and running statistics share the 16-bit
//! dtype, the saved `mean`/`rstd` and the weight/bias gradients are rounded to it; in PyTorch's
//! mixed case (a 16-bit input with f32 vectors, what autocast produces) they stay f32. Only the
//! output and the input gradient always have the input's dtype.

use super::{dense, dense_mut, dense_opt, in_pool, wrap, zeros};
use super::{HostBuffer, HostElement, Narrow};
use crate::backend::{BatchNormStats, GradMask, Grads3, RunningStatsMut, Strided};
use crate::dtype::DType;
use crate::ops::norm::cpu::NormElement;
use crate::ops::norm::{
    batch_norm_param_dtype, cpu as norm, Affine, BatchNormShape, NormGrads, RunningStats,
    RunningStatsUpdate, SavedStats, SavedStatsMut,
};
use crate::ops::KernelFloat;
use crate::storage::cpu::CpuStorage;
use crate::{BackendStorage, Error, Layout, Result};
use half::{bf16, f16};

/// Runs `$body` with `$T` the compute type and `$X` the tensor element type of `$dtype`:
/// `(f32, f32)`, `(f64, f64)`, `(f32, f16)`, `(f32, bf16)`; other dtypes are an error.
macro_rules! bn_kernel {
    ($op:expr, $dtype:expr, ($T:ident, $X:ident) => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $T = f32;
                type $X = f32;
                $body
            }
            DType::F64 => {
                type $T = f64;
                type $X = f64;
                $body
            }
            DType::F16 => {
                type $T = f32;
                type $X = f16;
                $body
            }
            DType::BF16 => {
                type $T = f32;
                type $X = bf16;
                $body
            }
            other => Err(Error::UnsupportedDType {
                op: $op,
                dtype: other,
                hint: "batch_norm runs on floating-point tensors; convert with \
                       to_dtype(DType::F32) first",
            }),
        }
    };
}

fn dtype_of(s: &Option<Strided<'_, CpuStorage>>) -> Option<DType> {
    s.map(|s| s.0.dtype())
}

/// The f32 per-channel results of a 16-bit call, rounded to the input dtype unless the call
/// is mixed (f32 vectors); tensor-shaped results already have the input dtype.
fn vectors_to<R: Narrow>(r: R, input: DType, params: DType) -> Result<R> {
    if params == input && matches!(input, DType::F16 | DType::BF16) {
        r.narrow(input)
    } else {
        Ok(r)
    }
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
    match running {
        Some(r) if matches!(params, DType::F16 | DType::BF16) => {
            // 16-bit running statistics: update f32 copies, then round them back in place.
            let mut mean = r.mean.0.to_dtype(r.mean.1, DType::F32)?;
            let mut var = r.var.0.to_dtype(r.var.1, DType::F32)?;
            let c = Layout::contiguous(r.mean.1.shape());
            let wide = RunningStatsMut {
                mean: (&mut mean, &c),
                var: (&mut var, &c),
                momentum: r.momentum,
            };
            let out = bn_kernel!(OP, dtype, (T, X) => {
                train_in::<T, X>(x, weight, bias, Some(wide), eps, &shape)
            })?;
            mean.to_dtype(&c, params)?
                .copy_into(&c, r.mean.0, r.mean.1)?;
            var.to_dtype(&c, params)?.copy_into(&c, r.var.0, r.var.1)?;
            vectors_to(out, dtype, params)
        }
        running => {
            let out = bn_kernel!(OP, dtype, (T, X) => {
                train_in::<T, X>(x, weight, bias, running, eps, &shape)
            })?;
            vectors_to(out, dtype, params)
        }
    }
}

/// Training forward: tensors as `X`, per-channel vectors as `T`.
fn train_in<T: HostElement + KernelFloat, X: HostElement + NormElement<T>>(
    x: Strided<'_, CpuStorage>,
    weight: Option<Strided<'_, CpuStorage>>,
    bias: Option<Strided<'_, CpuStorage>>,
    running: Option<RunningStatsMut<'_, CpuStorage>>,
    eps: f64,
    shape: &BatchNormShape,
) -> Result<[CpuStorage; 3]> {
    const OP: &str = "batch_norm";
    let shape = *shape;
    let input = dense::<X>(OP, x)?;
    let (w, b) = (dense_opt::<T>(OP, weight)?, dense_opt::<T>(OP, bias)?);
    let running = match running {
        None => None,
        Some(r) => Some(RunningStatsUpdate {
            mean: dense_mut::<T>(OP, (r.mean.0, r.mean.1))?,
            var: dense_mut::<T>(OP, (r.var.0, r.var.1))?,
            momentum: r.momentum,
        }),
    };
    let mut out = zeros::<X>(&shape.dims())?;
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
    bn_kernel!(OP, dtype, (T, X) => {
        let input = dense::<X>(OP, x)?;
        let (w, b) = (dense_opt::<T>(OP, weight)?, dense_opt::<T>(OP, bias)?);
        let (mean, var) = (dense::<T>(OP, running[0])?, dense::<T>(OP, running[1])?);
        let mut out = zeros::<X>(&shape.dims())?;
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
    let grads = bn_kernel!(OP, dtype, (T, X) => backward_in::<T, X>(grad, x, weight, stats, mask))?;
    vectors_to(grads, dtype, params)
}

/// Backward: tensors as `X`, per-channel vectors as `T`.
fn backward_in<T: HostElement + KernelFloat, X: HostElement + NormElement<T>>(
    grad: Strided<'_, CpuStorage>,
    x: Strided<'_, CpuStorage>,
    weight: Option<Strided<'_, CpuStorage>>,
    stats: BatchNormStats<'_, CpuStorage>,
    mask: GradMask,
) -> Result<Grads3<CpuStorage>> {
    const OP: &str = "batch_norm_backward";
    let shape = BatchNormShape::from_input_shape(x.1.shape())?;
    let (go, input) = (dense::<X>(OP, grad)?, dense::<X>(OP, x)?);
    let w = dense_opt::<T>(OP, weight)?;
    let c = shape.channels;
    let n = shape.dims().iter().product();
    let mut gi: HostBuffer<X> = zeros::<X>(&[if mask[0] { n } else { 0 }])?;
    let mut gw: HostBuffer<T> = zeros::<T>(&[if mask[1] { c } else { 0 }])?;
    let mut gb: HostBuffer<T> = zeros::<T>(&[if mask[2] { c } else { 0 }])?;
    let grads = NormGrads {
        input: mask[0].then_some(gi.as_mut_slice()),
        weight: mask[1].then_some(gw.as_mut_slice()),
        bias: mask[2].then_some(gb.as_mut_slice()),
    };
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
    Ok([
        mask[0].then(|| wrap(gi)),
        mask[1].then(|| wrap(gw)),
        mask[2].then(|| wrap(gb)),
    ])
}
