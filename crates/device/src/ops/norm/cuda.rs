//! CUDA batch norm and layer norm: the fused kernels of `norm.cu`, forward and backward.
//!
//! Both norms are statistics over groups of elements (a layer-norm row, a batch-norm channel of
//! the `[N, C, S]` view) followed by an elementwise pass, so one set of kernels serves both,
//! parametrised by `NormArgs`: `stats` (one block per statistic: mean, then squared
//! deviations), `apply` (`(x - mean) * rstd * w + b`), `backward_sums` (per statistic: sums of
//! `g` and `g * xhat`) and `backward_dx`, plus layer norm's per-column weight/bias gradients.
//! The formulas are the CPU kernels' (biased variance for normalising, unbiased for the running
//! variance, `rstd = 1 / sqrt(var + eps)`).
//!
//! **Dtypes.** The kernels read and write the tensor's own dtype: f16/bf16 inputs are read as
//! they are, computed in f32 registers and each output rounded once, with no widening or
//! narrowing pass over the tensor (a non-contiguous input is first copied contiguous). Every
//! sum accumulates in double, as the CPU kernels do. Statistics are computed in f32 (f64 for
//! f64 tensors) and normalise in that precision; the per-channel/per-row vectors (weight, bias,
//! saved and running statistics) are cast to it first, which is a copy of a `[C]`/`[rows]`
//! vector, never of the tensor. The saved `mean`/`rstd` are returned in the dtype of batch norm's
//! per-channel vectors ([`batch_norm_param_dtype`], the CPU backend's contract; autograd hands
//! them back to the backward unchanged): the input's dtype when weight, bias and running
//! statistics share it, F32 in PyTorch's mixed case of a 16-bit input with f32 vectors (what
//! autocast produces), where the weight/bias gradients are F32 too and only the output and
//! the input gradient have the 16-bit dtype. Against the CPU (which widens 16-bit tensors to f32, computes its statistics in
//! f64 and rounds each result once) the outputs agree to the dtype's tolerance: both round a
//! value computed in at least f32 from the same inputs. The backward takes the saved statistics
//! as given (rounded to the input dtype, as the CPU backward does).
//!
//! Running statistics are updated with a few tiny `[C]` elementwise ops in f32/f64. The
//! launchers live in `cuda_kernels.rs`. Known cost: the statistic kernels run one block per
//! statistic (as `reduce.cu` does), so a batch norm with few channels over a large `N * S`
//! uses few SMs, and layer norm's weight/bias gradients run one thread per column; splitting
//! those reductions over several blocks is the next step if the ResNet benchmark shows it.

use super::NormOps;
use super::{batch_norm_param_dtype, BatchNormShape, LayerNormShape};
use super::{BatchNormStats, RunningStatsMut};
use crate::error::{Error, Result};
use crate::ops::conv::cuda::Dense;
use crate::ops::copy::CopyOps;
use crate::ops::elementwise::{BinaryOp, ElementwiseOps, UnaryOp};
use crate::ops::kernel_error::KernelError;
use crate::seam::{GradMask, InputGrads};
use crate::storage::CudaStorage;
use crate::{DType, Layout};

type View<'a> = (&'a CudaStorage, &'a Layout);

pub use super::cuda_kernels::NORM_KERNELS;
#[cfg(test)]
pub(crate) use super::cuda_kernels::{kernel_name, KERNEL_KINDS};
use super::cuda_kernels::{stat_dtype, Kernels, NormArgs};

/// `(storage, layout)` as a contiguous buffer of `numel` elements.
fn dense<'a>(op: &'static str, (s, l): View<'a>, numel: usize) -> Result<Dense<'a>> {
    s.check_view(op, l)?;
    check_numel(op, "operand", l, numel)?;
    Dense::of(s, l)
}

fn check_numel(op: &'static str, buffer: &'static str, l: &Layout, want: usize) -> Result<()> {
    if l.numel() != want {
        return Err(Error::Kernel(KernelError::BufferLength {
            op,
            buffer,
            shape: l.shape().to_vec(),
            expected: want,
            actual: l.numel(),
        }));
    }
    Ok(())
}

/// A per-statistic or per-parameter vector of `n` elements as a contiguous `at` copy.
fn small(op: &'static str, (s, l): View<'_>, at: DType, n: usize) -> Result<CudaStorage> {
    s.check_view(op, l)?;
    check_numel(op, "vector", l, n)?;
    s.to_dtype(l, at)
}

fn small_opt(
    op: &'static str,
    v: Option<View<'_>>,
    at: DType,
    n: usize,
) -> Result<Option<CudaStorage>> {
    v.map(|v| small(op, v, at, n)).transpose()
}

/// Rounds a statistics-dtype vector to `dtype` (a no-op when they agree).
fn round(x: CudaStorage, dtype: DType) -> Result<CudaStorage> {
    if x.dtype() == dtype {
        Ok(x)
    } else {
        x.to_dtype(&Layout::contiguous(&[x.len()]), dtype)
    }
}

/// `x op v` for a contiguous vector `x`.
fn with_scalar(x: &CudaStorage, v: f64, op: BinaryOp) -> Result<CudaStorage> {
    let s = CudaStorage::full_cuda(x.ordinal(), 1, v, x.dtype())?;
    let n = x.len();
    x.binary(
        &Layout::contiguous(&[n]),
        &s,
        &Layout::new(vec![n], vec![0], 0),
        op,
    )
}

/// `1 / sqrt(var + eps)` of a contiguous vector.
fn rstd_of(var: &CudaStorage, eps: f64) -> Result<CudaStorage> {
    let shifted = with_scalar(var, eps, BinaryOp::Add)?;
    shifted.unary(&Layout::contiguous(&[shifted.len()]), UnaryOp::Rsqrt)
}

fn dtype_of(v: Option<View<'_>>) -> Option<DType> {
    v.map(|v| v.0.dtype())
}

/// The output gradient and the input must share a dtype (the kernels read both as one type).
fn same_dtype(op: &'static str, go: &CudaStorage, x: &CudaStorage) -> Result<()> {
    if go.dtype() == x.dtype() {
        Ok(())
    } else {
        Err(Error::DTypeMismatch {
            op,
            lhs: go.dtype(),
            rhs: x.dtype(),
        })
    }
}

impl NormOps for CudaStorage {
    /// Layer norm over the last `normalized_dims` dims: `[out, mean, rstd]`.
    fn layer_norm(
        &self,
        layout: &Layout,
        normalized_dims: usize,
        weight: Option<View<'_>>,
        bias: Option<View<'_>>,
        eps: f64,
    ) -> Result<[Self; 3]> {
        const OP: &str = "layer_norm";
        let shape = layout.shape();
        let k = normalized_dims.min(shape.len());
        let s = LayerNormShape::new(shape, &shape[shape.len() - k..])?;
        let at = stat_dtype(OP, self.dtype())?;
        let args = NormArgs::layer(&s, eps);
        let x = dense(OP, (self, layout), s.rows * s.cols)?;
        let (w, b) = (
            small_opt(OP, weight, at, s.cols)?,
            small_opt(OP, bias, at, s.cols)?,
        );
        let kernels = Kernels { x: &x, args, at };
        let [mean, _, rstd] = kernels.stats()?;
        let y = kernels.apply([&mean, &rstd], w.as_ref(), b.as_ref())?;
        let dt = self.dtype();
        Ok([y, round(mean, dt)?, round(rstd, dt)?])
    }
    /// Gradients of layer norm from `self` = the output gradient.
    fn layer_norm_backward(
        &self,
        layout: &Layout,
        input: View<'_>,
        normalized_dims: usize,
        weight: Option<View<'_>>,
        saved: [View<'_>; 2],
        mask: GradMask,
    ) -> Result<InputGrads<Self>> {
        const OP: &str = "layer_norm_backward";
        let shape = input.1.shape();
        let k = normalized_dims.min(shape.len());
        let s = LayerNormShape::new(shape, &shape[shape.len() - k..])?;
        let at = stat_dtype(OP, self.dtype())?;
        let args = NormArgs::layer(&s, 0.0);
        let total = s.rows * s.cols;
        let go = dense(OP, (self, layout), total)?;
        let x = dense(OP, input, total)?;
        same_dtype(OP, &go, &x)?;
        let w = small_opt(OP, weight, at, s.cols)?;
        let mean = small(OP, saved[0], at, s.rows)?;
        let rstd = small(OP, saved[1], at, s.rows)?;
        let kernels = Kernels { x: &x, args, at };
        let stats = [&mean, &rstd];
        let dt = self.dtype();
        let mut grads = InputGrads::default();
        if mask.input {
            let sums = kernels.backward_sums(&go, stats, w.as_ref())?;
            grads.input = Some(kernels.backward_dx(&go, stats, w.as_ref(), Some(&sums))?);
        }
        if mask.weight || mask.bias {
            let [dw, db] = kernels.layer_param_grads(&go, stats)?;
            grads.weight = mask.weight.then(|| round(dw, dt)).transpose()?;
            grads.bias = mask.bias.then(|| round(db, dt)).transpose()?;
        }
        Ok(grads)
    }
    /// Batch norm in training mode: `[out, mean, rstd]`, running statistics updated in place.
    fn batch_norm_train(
        &self,
        layout: &Layout,
        weight: Option<View<'_>>,
        bias: Option<View<'_>>,
        running: Option<RunningStatsMut<'_, Self>>,
        eps: f64,
    ) -> Result<[Self; 3]> {
        const OP: &str = "batch_norm";
        let s = BatchNormShape::from_input_shape(layout.shape())?;
        let (rm, rv) = (
            running.as_ref().map(|r| r.mean.0.dtype()),
            running.as_ref().map(|r| r.var.0.dtype()),
        );
        let params =
            batch_norm_param_dtype(OP, self.dtype(), [dtype_of(weight), dtype_of(bias), rm, rv])?;
        if s.count() < 2 && s.channels > 0 {
            return Err(KernelError::TooFewValuesPerChannel {
                op: OP,
                count: s.count(),
            }
            .into());
        }
        let at = stat_dtype(OP, self.dtype())?;
        let args = NormArgs::batch(&s, eps);
        let x = dense(OP, (self, layout), s.dims().iter().product())?;
        let (w, b) = (
            small_opt(OP, weight, at, s.channels)?,
            small_opt(OP, bias, at, s.channels)?,
        );
        let kernels = Kernels { x: &x, args, at };
        let [mean, var, rstd] = kernels.stats()?;
        let y = kernels.apply([&mean, &rstd], w.as_ref(), b.as_ref())?;
        if let Some(r) = running {
            let m = r.momentum;
            let n = s.count() as f64;
            let c = s.channels;
            let update = |(old, ol): (&mut CudaStorage, &Layout),
                          stat: &CudaStorage,
                          scale: f64| {
                let kept = with_scalar(&small(OP, (&*old, ol), at, c)?, 1.0 - m, BinaryOp::Mul)?;
                let add = with_scalar(stat, m * scale, BinaryOp::Mul)?;
                let cl = Layout::contiguous(&[c]);
                let new = round(kept.binary(&cl, &add, &cl, BinaryOp::Add)?, old.dtype())?;
                new.copy_into(&cl, old, ol)
            };
            update((r.mean.0, r.mean.1), &mean, 1.0)?;
            update((r.var.0, r.var.1), &var, n / (n - 1.0))?;
        }
        Ok([y, round(mean, params)?, round(rstd, params)?])
    }
    /// Batch norm in evaluation mode (running statistics).
    fn batch_norm_eval(
        &self,
        layout: &Layout,
        weight: Option<View<'_>>,
        bias: Option<View<'_>>,
        running_mean: View<'_>,
        running_var: View<'_>,
        eps: f64,
    ) -> Result<Self> {
        let running = [running_mean, running_var];
        const OP: &str = "batch_norm";
        let s = BatchNormShape::from_input_shape(layout.shape())?;
        let stats = running.map(|r| Some(r.0.dtype()));
        batch_norm_param_dtype(
            OP,
            self.dtype(),
            [dtype_of(weight), dtype_of(bias), stats[0], stats[1]],
        )?;
        let at = stat_dtype(OP, self.dtype())?;
        let args = NormArgs::batch(&s, eps);
        let x = dense(OP, (self, layout), s.dims().iter().product())?;
        let (w, b) = (
            small_opt(OP, weight, at, s.channels)?,
            small_opt(OP, bias, at, s.channels)?,
        );
        let mean = small(OP, running[0], at, s.channels)?;
        let rstd = rstd_of(&small(OP, running[1], at, s.channels)?, eps)?;
        Kernels { x: &x, args, at }.apply([&mean, &rstd], w.as_ref(), b.as_ref())
    }
    /// Gradients of batch norm from `self` = the output gradient.
    fn batch_norm_backward(
        &self,
        layout: &Layout,
        input: View<'_>,
        weight: Option<View<'_>>,
        stats: BatchNormStats<'_, Self>,
        mask: GradMask,
    ) -> Result<InputGrads<Self>> {
        const OP: &str = "batch_norm_backward";
        let s = BatchNormShape::from_input_shape(input.1.shape())?;
        let at = stat_dtype(OP, self.dtype())?;
        let args = NormArgs::batch(&s, 0.0);
        let total = s.dims().iter().product();
        let go = dense(OP, (self, layout), total)?;
        let x = dense(OP, input, total)?;
        same_dtype(OP, &go, &x)?;
        let [s0, s1] = match stats {
            BatchNormStats::Batch { mean, rstd } => [mean, rstd],
            BatchNormStats::Running { mean, var, .. } => [mean, var],
        }
        .map(|v| Some(v.0.dtype()));
        let params = batch_norm_param_dtype(OP, self.dtype(), [dtype_of(weight), s0, s1])?;
        let w = small_opt(OP, weight, at, s.channels)?;
        let c = s.channels;
        let (mean, rstd, train) = match stats {
            BatchNormStats::Batch { mean, rstd } => {
                (small(OP, mean, at, c)?, small(OP, rstd, at, c)?, true)
            }
            BatchNormStats::Running { mean, var, eps } => (
                small(OP, mean, at, c)?,
                rstd_of(&small(OP, var, at, c)?, eps)?,
                false,
            ),
        };
        let kernels = Kernels { x: &x, args, at };
        let st = [&mean, &rstd];
        // unweighted sums: sum(go) is dbias, sum(go * xhat) is dweight
        let sums = if (train && mask.input) || mask.weight || mask.bias {
            Some(kernels.backward_sums(&go, st, None)?)
        } else {
            None
        };
        let mut grads = InputGrads::default();
        if mask.input {
            let used = if train { sums.as_ref() } else { None };
            grads.input = Some(kernels.backward_dx(&go, st, w.as_ref(), used)?);
        }
        // weight/bias gradients in the dtype of the weight and statistics (f32 when mixed)
        if let Some([sum_g, sum_gx]) = sums {
            grads.weight = mask.weight.then(|| round(sum_gx, params)).transpose()?;
            grads.bias = mask.bias.then(|| round(sum_g, params)).transpose()?;
        }
        Ok(grads)
    }
}
