//! [`NormOps`] for host buffers, over the kernels of [`super`] (`crate::ops::norm::cpu`).
//!
//! Layer norm: f32/f64 natively, f16/bf16 computed in f32 (operands widened, results rounded
//! once; `crate::ops::cpu_dispatch`).
//!
//! Batch norm dtypes: f32/f64 run natively. An f16/bf16 input runs the kernels with `T = f32`
//! on the 16-bit tensors themselves (each element widened as it is read, each result rounded
//! once as it is written: no f32 copy of the tensor), with the per-channel vectors in f32
//! (16-bit ones are widened, a `[C]` copy). Which dtype those vectors come back in follows
//! [`batch_norm_param_dtype`]: when weight, bias and running statistics share the 16-bit
//! dtype, the saved `mean`/`rstd` and the weight/bias gradients are rounded to it; in PyTorch's
//! mixed case (a 16-bit input with f32 vectors, what autocast produces) they stay f32. Only the
//! output and the input gradient always have the input's dtype.

use super::super::{
    batch_norm_param_dtype, Affine, BatchNormShape, BatchNormStats, LayerNormShape, NormGrads,
    NormOps, RunningStats, RunningStatsMut, RunningStatsUpdate, SavedStats, SavedStatsMut,
};
use super::{
    batch_norm_eval_backward, batch_norm_eval_forward, batch_norm_train_backward,
    batch_norm_train_forward, layer_norm_backward as layer_norm_backward_kernel,
    layer_norm_forward, NormElement,
};
use crate::dtype::DType;
use crate::ops::copy::CopyOps;
use crate::ops::cpu_dispatch::{
    dense, dense_mut, dense_opt, float_dispatch, float_kernel, for_overwrite, in_pool, wrap, zeros,
    Narrow,
};
use crate::ops::KernelFloat;
use crate::seam::{GradMask, InputGrads, Strided};
use crate::storage::{HostBuffer, HostElement};
use crate::{CpuStorage, Error, Layout, Result};

impl NormOps for CpuStorage {
    fn batch_norm_train(
        &self,
        layout: &Layout,
        weight: Option<Strided<'_, Self>>,
        bias: Option<Strided<'_, Self>>,
        running: Option<RunningStatsMut<'_, Self>>,
        eps: f64,
    ) -> Result<[Self; 3]> {
        batch_norm_train((self, layout), weight, bias, running, eps)
    }

    fn batch_norm_eval(
        &self,
        layout: &Layout,
        weight: Option<Strided<'_, Self>>,
        bias: Option<Strided<'_, Self>>,
        running_mean: Strided<'_, Self>,
        running_var: Strided<'_, Self>,
        eps: f64,
    ) -> Result<Self> {
        let running = [running_mean, running_var];
        batch_norm_eval((self, layout), weight, bias, running, eps)
    }

    fn batch_norm_backward(
        &self,
        layout: &Layout,
        input: Strided<'_, Self>,
        weight: Option<Strided<'_, Self>>,
        stats: BatchNormStats<'_, Self>,
        mask: GradMask,
    ) -> Result<InputGrads<Self>> {
        batch_norm_backward((self, layout), input, weight, stats, mask)
    }

    fn layer_norm(
        &self,
        layout: &Layout,
        normalized_dims: usize,
        weight: Option<Strided<'_, Self>>,
        bias: Option<Strided<'_, Self>>,
        eps: f64,
    ) -> Result<[Self; 3]> {
        const OP: &str = "layer_norm";
        let shape = layer_norm_shape(layout.shape(), normalized_dims)?;
        float_kernel!(OP, self.dtype(), T => {
            let input = dense::<T>(OP, (self, layout))?;
            let (w, b) = (dense_opt::<T>(OP, weight)?, dense_opt::<T>(OP, bias)?);
            let mut out = for_overwrite::<T>(&[shape.rows, shape.cols])?;
            let (mut mean, mut rstd) = (zeros::<T>(&[shape.rows])?, zeros::<T>(&[shape.rows])?);
            let affine = Affine { weight: w.as_deref(), bias: b.as_deref() };
            let saved = SavedStatsMut { mean: &mut mean, rstd: &mut rstd };
            in_pool(|| layer_norm_forward(&shape, &input, affine, eps, &mut out, saved))?;
            Ok([wrap(out), wrap(mean), wrap(rstd)])
        })
    }

    fn layer_norm_backward(
        &self,
        layout: &Layout,
        input: Strided<'_, Self>,
        normalized_dims: usize,
        weight: Option<Strided<'_, Self>>,
        saved: [Strided<'_, Self>; 2],
        mask: GradMask,
    ) -> Result<InputGrads<Self>> {
        const OP: &str = "layer_norm_backward";
        let shape = layer_norm_shape(input.1.shape(), normalized_dims)?;
        float_kernel!(OP, self.dtype(), T => {
            let go = dense::<T>(OP, (self, layout))?;
            let (x, w) = (dense::<T>(OP, input)?, dense_opt::<T>(OP, weight)?);
            let (mean, rstd) = (dense::<T>(OP, saved[0])?, dense::<T>(OP, saved[1])?);
            let mut gi = for_overwrite::<T>(&[if mask.input { shape.rows * shape.cols } else { 0 }])?;
            let mut gw = zeros::<T>(&[if mask.weight { shape.cols } else { 0 }])?;
            let mut gb = zeros::<T>(&[if mask.bias { shape.cols } else { 0 }])?;
            let grads = NormGrads {
                input: mask.input.then_some(gi.as_mut_slice()),
                weight: mask.weight.then_some(gw.as_mut_slice()),
                bias: mask.bias.then_some(gb.as_mut_slice()),
            };
            let saved = SavedStats { mean: &mean, rstd: &rstd };
            in_pool(|| layer_norm_backward_kernel(&shape, &go, &x, w.as_deref(), saved, grads))?;
            Ok(InputGrads {
                input: mask.input.then(|| wrap(gi)),
                weight: mask.weight.then(|| wrap(gw)),
                bias: mask.bias.then(|| wrap(gb)),
            })
        })
    }
}

fn layer_norm_shape(shape: &[usize], normalized_dims: usize) -> Result<LayerNormShape> {
    let k = normalized_dims.min(shape.len());
    Ok(LayerNormShape::new(shape, &shape[shape.len() - k..])?)
}

/// The hint of batch norm's unsupported-dtype error.
const BATCH_NORM_HINT: &str =
    "batch_norm runs on floating-point tensors; convert with to_dtype(DType::F32) first";

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

fn batch_norm_train(
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
            let out = float_dispatch!(OP, dtype, BATCH_NORM_HINT, (T, X) => {
                train_in::<T, X>(x, weight, bias, Some(wide), eps, &shape)
            })?;
            mean.to_dtype(&c, params)?
                .copy_into(&c, r.mean.0, r.mean.1)?;
            var.to_dtype(&c, params)?.copy_into(&c, r.var.0, r.var.1)?;
            vectors_to(out, dtype, params)
        }
        running => {
            let out = float_dispatch!(OP, dtype, BATCH_NORM_HINT, (T, X) => {
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
    let mut out = for_overwrite::<X>(&shape.dims())?;
    let c = [shape.channels];
    let (mut mean, mut rstd) = (for_overwrite::<T>(&c)?, for_overwrite::<T>(&c)?);
    let affine = Affine {
        weight: w.as_deref(),
        bias: b.as_deref(),
    };
    let saved = SavedStatsMut {
        mean: &mut mean,
        rstd: &mut rstd,
    };
    in_pool(|| batch_norm_train_forward(&shape, &input, affine, running, eps, &mut out, saved))?;
    Ok([wrap(out), wrap(mean), wrap(rstd)])
}

fn batch_norm_eval(
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
    float_dispatch!(OP, dtype, BATCH_NORM_HINT, (T, X) => {
        let input = dense::<X>(OP, x)?;
        let (w, b) = (dense_opt::<T>(OP, weight)?, dense_opt::<T>(OP, bias)?);
        let (mean, var) = (dense::<T>(OP, running[0])?, dense::<T>(OP, running[1])?);
        let mut out = for_overwrite::<X>(&shape.dims())?;
        let affine = Affine { weight: w.as_deref(), bias: b.as_deref() };
        let stats = RunningStats { mean: &mean, var: &var };
        in_pool(|| batch_norm_eval_forward(&shape, &input, affine, stats, eps, &mut out))?;
        Ok(wrap(out))
    })
}

fn batch_norm_backward(
    grad: Strided<'_, CpuStorage>,
    x: Strided<'_, CpuStorage>,
    weight: Option<Strided<'_, CpuStorage>>,
    stats: BatchNormStats<'_, CpuStorage>,
    mask: GradMask,
) -> Result<InputGrads<CpuStorage>> {
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
    let grads = float_dispatch!(OP, dtype, BATCH_NORM_HINT, (T, X) => backward_in::<T, X>(grad, x, weight, stats, mask))?;
    vectors_to(grads, dtype, params)
}

/// Backward: tensors as `X`, per-channel vectors as `T`.
fn backward_in<T: HostElement + KernelFloat, X: HostElement + NormElement<T>>(
    grad: Strided<'_, CpuStorage>,
    x: Strided<'_, CpuStorage>,
    weight: Option<Strided<'_, CpuStorage>>,
    stats: BatchNormStats<'_, CpuStorage>,
    mask: GradMask,
) -> Result<InputGrads<CpuStorage>> {
    const OP: &str = "batch_norm_backward";
    let shape = BatchNormShape::from_input_shape(x.1.shape())?;
    let (go, input) = (dense::<X>(OP, grad)?, dense::<X>(OP, x)?);
    let w = dense_opt::<T>(OP, weight)?;
    let c = shape.channels;
    let n = shape.dims().iter().product();
    let mut gi: HostBuffer<X> = for_overwrite::<X>(&[if mask.input { n } else { 0 }])?;
    let mut gw: HostBuffer<T> = for_overwrite::<T>(&[if mask.weight { c } else { 0 }])?;
    let mut gb: HostBuffer<T> = for_overwrite::<T>(&[if mask.bias { c } else { 0 }])?;
    let grads = NormGrads {
        input: mask.input.then_some(gi.as_mut_slice()),
        weight: mask.weight.then_some(gw.as_mut_slice()),
        bias: mask.bias.then_some(gb.as_mut_slice()),
    };
    match stats {
        BatchNormStats::Batch { mean, rstd } => {
            let (mean, rstd) = (dense::<T>(OP, mean)?, dense::<T>(OP, rstd)?);
            let saved = SavedStats {
                mean: &mean,
                rstd: &rstd,
            };
            in_pool(|| batch_norm_train_backward(&shape, &go, &input, w.as_deref(), saved, grads))?;
        }
        BatchNormStats::Running { mean, var, eps } => {
            let (mean, var) = (dense::<T>(OP, mean)?, dense::<T>(OP, var)?);
            let running = RunningStats {
                mean: &mean,
                var: &var,
            };
            in_pool(|| {
                batch_norm_eval_backward(&shape, &go, &input, w.as_deref(), running, eps, grads)
            })?;
        }
    }
    Ok(InputGrads {
        input: mask.input.then(|| wrap(gi)),
        weight: mask.weight.then(|| wrap(gw)),
        bias: mask.bias.then(|| wrap(gb)),
    })
}
