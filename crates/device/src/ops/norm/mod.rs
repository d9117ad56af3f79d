//! Normalisation: `batch_norm` (training and evaluation) and `layer_norm`, forward and backward.
//!
//! Batch norm sees its input as `[N, C, S]` (`S` = product of the spatial dims, 1 for
//! `BatchNorm1d` on `[N, C]`) and normalises each channel over `N * S` values. In training it
//! normalises with the batch mean and the *biased* variance, saves `mean` and
//! `rstd = 1 / sqrt(var + eps)` (PyTorch's `save_mean` / `save_invstd`) for backward, and, when
//! running statistics are tracked, updates them as
//! `running = (1 - momentum) * running + momentum * batch_stat` with the *unbiased* variance
//! (`var * n / (n - 1)`). PyTorch's `momentum=None` (cumulative average) is the caller's
//! `momentum = 1 / num_batches_tracked`. In evaluation it normalises with the running
//! statistics.
//!
//! Layer norm sees its input as `[rows, cols]` (`cols` = product of `normalized_shape`, the
//! trailing dims) and normalises each row; it saves per-row `mean` and `rstd`.
//!
//! `weight` (gamma) and `bias` (beta) are optional, as with `affine=False` /
//! `elementwise_affine=False`. Statistics are computed in `f64` (two passes: mean, then
//! squared deviations) whatever the element type; the backward kernels compute only the
//! gradients that are asked for ([`NormGrads`]).
//!
//! **Mixed dtypes (batch norm only).** PyTorch's batch norm (cuDNN's, and its CPU kernel's
//! "mixed type" path) takes an F16/BF16 input with F32 weight, bias and running statistics:
//! autocast hands it a 16-bit conv output while the module's parameters and buffers stay f32.
//! kiln follows that rule ([`batch_norm_param_dtype`]): the per-channel vectors either all have
//! the input's dtype, or the input is 16-bit and they are all F32. In the mixed case the op
//! computes in f32, the output and the input gradient have the input's dtype (each rounded once),
//! and the saved `mean`/`rstd`, the updated running statistics and the weight/bias gradients are
//! F32, as in PyTorch.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
mod cuda_kernels;

use super::kernel_error::KernelError;
use crate::ops::buffer::BufferOps;
use crate::seam::{seam_trait, GradMask, InputGrads, Lower, Strided};
use crate::{DType, Error};
use crate::{Device, Layout, Result};

/// Batch norm's running statistics, updated in place by a training forward:
/// `running = (1 - momentum) * running + momentum * batch_stat` (unbiased variance).
#[derive(Debug)]
pub struct RunningStatsMut<'a, S> {
    /// Running mean `[C]` (a contiguous view).
    pub mean: (&'a mut S, &'a Layout),
    /// Running variance `[C]` (a contiguous view).
    pub var: (&'a mut S, &'a Layout),
    /// Weight of the new batch statistic.
    pub momentum: f64,
}

/// The per-channel statistics a batch-norm backward differentiates through.
#[derive(Debug, Clone, Copy)]
pub enum BatchNormStats<'a, S> {
    /// Training: the batch `mean` and `rstd = 1 / sqrt(var + eps)` the forward returned.
    Batch {
        /// Saved mean `[C]`.
        mean: Strided<'a, S>,
        /// Saved `rstd` `[C]`.
        rstd: Strided<'a, S>,
    },
    /// Evaluation: the running statistics (constants) and `eps`.
    Running {
        /// Running mean `[C]`.
        mean: Strided<'a, S>,
        /// Running variance `[C]`.
        var: Strided<'a, S>,
        /// The forward's `eps`.
        eps: f64,
    },
}

impl<'a, S: 'a> Lower<S> for RunningStatsMut<'a, crate::Storage>
where
    &'a mut crate::Storage: Lower<S, Out = &'a mut S>,
{
    type Out = RunningStatsMut<'a, S>;
    fn lower(self, op: &'static str, device: Device) -> Result<Self::Out> {
        Ok(RunningStatsMut {
            mean: self.mean.lower(op, device)?,
            var: self.var.lower(op, device)?,
            momentum: self.momentum,
        })
    }
}

impl<'a, S: 'a> Lower<S> for BatchNormStats<'a, crate::Storage>
where
    &'a crate::Storage: Lower<S, Out = &'a S>,
{
    type Out = BatchNormStats<'a, S>;
    fn lower(self, op: &'static str, device: Device) -> Result<Self::Out> {
        Ok(match self {
            BatchNormStats::Batch { mean, rstd } => BatchNormStats::Batch {
                mean: mean.lower(op, device)?,
                rstd: rstd.lower(op, device)?,
            },
            BatchNormStats::Running { mean, var, eps } => BatchNormStats::Running {
                mean: mean.lower(op, device)?,
                var: var.lower(op, device)?,
                eps,
            },
        })
    }
}

seam_trait! {
    /// Batch and layer normalisation (input shapes validated by the caller). Each forward
    /// returns what its backward needs; each backward computes only the gradients `mask` asks
    /// for.
    pub trait NormOps: BufferOps {
        /// Batch norm in training mode over `self` `[N, C, ...]`: returns the output and the
        /// saved batch `mean` and `rstd` (`[C]`), and updates `running` in place when given.
        op("batch_norm")
        fn batch_norm_train(
            &self,
            layout: &Layout,
            weight: Option<Strided<'_, Self>>,
            bias: Option<Strided<'_, Self>>,
            running: Option<RunningStatsMut<'_, Self>>,
            eps: f64,
        ) -> Result<[Self; 3]>;
        /// Batch norm in evaluation mode (normalises with the running statistics).
        op("batch_norm")
        fn batch_norm_eval(
            &self,
            layout: &Layout,
            weight: Option<Strided<'_, Self>>,
            bias: Option<Strided<'_, Self>>,
            running_mean: Strided<'_, Self>,
            running_var: Strided<'_, Self>,
            eps: f64,
        ) -> Result<Self>;
        /// Gradients of batch norm from `self` = the output gradient.
        fn batch_norm_backward(
            &self,
            layout: &Layout,
            input: Strided<'_, Self>,
            weight: Option<Strided<'_, Self>>,
            stats: BatchNormStats<'_, Self>,
            mask: GradMask,
        ) -> Result<InputGrads<Self>>;
        /// Layer norm of `self` over its last `normalized_dims` dims (each leading index is one
        /// row): returns the output and the saved per-row `mean` and `rstd`.
        fn layer_norm(
            &self,
            layout: &Layout,
            normalized_dims: usize,
            weight: Option<Strided<'_, Self>>,
            bias: Option<Strided<'_, Self>>,
            eps: f64,
        ) -> Result<[Self; 3]>;
        /// Gradients of layer norm from `self` = the output gradient.
        fn layer_norm_backward(
            &self,
            layout: &Layout,
            input: Strided<'_, Self>,
            normalized_dims: usize,
            weight: Option<Strided<'_, Self>>,
            saved: [Strided<'_, Self>; 2],
            mask: GradMask,
        ) -> Result<InputGrads<Self>>;
    }
}

/// The dtype of batch norm's per-channel vectors (weight, bias, running and saved statistics,
/// and the weight/bias gradients) for an input of dtype `input`, checked against the `params`
/// that are present (PyTorch's rule for mixed dtypes, see the module docs).
///
/// Returns `input` when every present vector has the input's dtype (or none is present), `F32`
/// when the input is F16/BF16 and every present vector is F32. Anything else (vectors of
/// different dtypes, or 16-bit vectors with an f32 input) is [`Error::DTypeMismatch`], whose
/// message says to convert with `to_dtype`.
pub fn batch_norm_param_dtype(
    op: &'static str,
    input: DType,
    params: impl IntoIterator<Item = Option<DType>>,
) -> Result<DType, Error> {
    let mut found: Option<DType> = None;
    for p in params.into_iter().flatten() {
        match found {
            Some(f) if f != p => return Err(Error::DTypeMismatch { op, lhs: f, rhs: p }),
            _ => found = Some(p),
        }
    }
    match found {
        None => Ok(input),
        Some(p) if p == input => Ok(p),
        Some(DType::F32) if matches!(input, DType::F16 | DType::BF16) => Ok(DType::F32),
        Some(p) => Err(Error::DTypeMismatch {
            op,
            lhs: input,
            rhs: p,
        }),
    }
}

/// Batch-norm sizes: input `[batch, channels, spatial...]` viewed as `[N, C, S]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchNormShape {
    /// `N`.
    pub batch: usize,
    /// `C`.
    pub channels: usize,
    /// `S`: product of the dims after the channel dim.
    pub spatial: usize,
}

impl BatchNormShape {
    /// Views an input of shape `[N, C, ...]` (at least two dims) as `[N, C, S]`.
    pub fn from_input_shape(input_shape: &[usize]) -> Result<Self, KernelError> {
        match input_shape {
            [batch, channels, spatial @ ..] => Ok(Self {
                batch: *batch,
                channels: *channels,
                spatial: spatial.iter().product(),
            }),
            _ => Err(KernelError::InvalidShape {
                op: "batch_norm",
                shape: input_shape.to_vec(),
                rule: "the input needs at least 2 dims [N, C, ...]; add a batch dim".into(),
            }),
        }
    }

    /// `[N, C, S]`.
    pub fn dims(&self) -> [usize; 3] {
        [self.batch, self.channels, self.spatial]
    }

    /// Values per channel, `N * S`.
    pub fn count(&self) -> usize {
        self.batch * self.spatial
    }
}

/// Layer-norm sizes: input viewed as `[rows, cols]`, `cols` = product of `normalized_shape`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LayerNormShape {
    /// Number of independently normalised rows (product of the leading dims).
    pub rows: usize,
    /// Elements per row (product of `normalized_shape`).
    pub cols: usize,
}

impl LayerNormShape {
    /// Checks that `input_shape` ends with `normalized_shape` (PyTorch's rule) and views it as
    /// `[rows, cols]`.
    pub fn new(input_shape: &[usize], normalized_shape: &[usize]) -> Result<Self, KernelError> {
        let k = normalized_shape.len();
        if k == 0
            || k > input_shape.len()
            || input_shape[input_shape.len() - k..] != *normalized_shape
        {
            return Err(KernelError::InvalidShape {
                op: "layer_norm",
                shape: input_shape.to_vec(),
                rule: format!(
                    "normalized_shape {normalized_shape:?} must be a non-empty suffix of the input \
                     shape; pass the input's last dims as normalized_shape"
                ),
            });
        }
        Ok(Self {
            rows: input_shape[..input_shape.len() - k].iter().product(),
            cols: normalized_shape.iter().product(),
        })
    }
}

/// Optional per-feature scale (`weight`, gamma) and shift (`bias`, beta).
#[derive(Debug, Clone, Copy)]
pub struct Affine<'a, T> {
    /// Scale, one per channel / normalised element; `None` means 1.
    pub weight: Option<&'a [T]>,
    /// Shift, one per channel / normalised element; `None` means 0.
    pub bias: Option<&'a [T]>,
}

impl<T> Affine<'_, T> {
    /// No weight, no bias (`affine=False`).
    pub fn none() -> Self {
        Self {
            weight: None,
            bias: None,
        }
    }
}

/// Batch norm's running statistics, read in evaluation mode.
#[derive(Debug, Clone, Copy)]
pub struct RunningStats<'a, T> {
    /// Running mean, `[C]`.
    pub mean: &'a [T],
    /// Running (unbiased) variance, `[C]`.
    pub var: &'a [T],
}

/// Batch norm's running statistics, updated in place in training mode.
#[derive(Debug)]
pub struct RunningStatsUpdate<'a, T> {
    /// Running mean, `[C]`.
    pub mean: &'a mut [T],
    /// Running (unbiased) variance, `[C]`.
    pub var: &'a mut [T],
    /// Weight of the new batch statistic (PyTorch's default: 0.1).
    pub momentum: f64,
}

/// The statistics a forward pass saves for backward: per channel (batch norm) or per row
/// (layer norm).
#[derive(Debug, Clone, Copy)]
pub struct SavedStats<'a, T> {
    /// Means.
    pub mean: &'a [T],
    /// `1 / sqrt(var + eps)` (biased variance).
    pub rstd: &'a [T],
}

/// Where a forward pass writes the statistics it saves for backward.
#[derive(Debug)]
pub struct SavedStatsMut<'a, T> {
    /// Means.
    pub mean: &'a mut [T],
    /// `1 / sqrt(var + eps)` (biased variance).
    pub rstd: &'a mut [T],
}

/// Where a backward pass writes its gradients; `None` skips that gradient (PyTorch's
/// `output_mask`). The input gradient has the input's element type `X` (batch norm's CPU
/// kernels take a 16-bit `X` with `T = f32`), the parameter gradients the parameters' `T`.
#[derive(Debug, Default)]
pub struct NormGrads<'a, T, X = T> {
    /// Gradient of the input, the input's shape.
    pub input: Option<&'a mut [X]>,
    /// Gradient of the weight.
    pub weight: Option<&'a mut [T]>,
    /// Gradient of the bias.
    pub bias: Option<&'a mut [T]>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_norm_param_dtype_follows_pytorchs_mixed_rule() {
        let f = |input, params: &[Option<DType>]| {
            batch_norm_param_dtype("batch_norm", input, params.iter().copied())
        };
        assert_eq!(f(DType::BF16, &[]).unwrap(), DType::BF16);
        assert_eq!(f(DType::BF16, &[None, None]).unwrap(), DType::BF16);
        assert_eq!(f(DType::F16, &[Some(DType::F16)]).unwrap(), DType::F16);
        assert_eq!(f(DType::F64, &[Some(DType::F64)]).unwrap(), DType::F64);
        for half in [DType::F16, DType::BF16] {
            let mixed = [Some(DType::F32), None, Some(DType::F32)];
            assert_eq!(f(half, &mixed).unwrap(), DType::F32);
        }
        // f32 input with 16-bit vectors, f64 vectors for a 16-bit input, and vectors that
        // disagree among themselves are refused, naming both dtypes
        for (input, params) in [
            (DType::F32, vec![Some(DType::BF16)]),
            (DType::BF16, vec![Some(DType::F64)]),
            (DType::BF16, vec![Some(DType::F32), Some(DType::BF16)]),
        ] {
            let err = f(input, &params).unwrap_err();
            assert!(matches!(err, Error::DTypeMismatch { .. }), "{err}");
            assert!(err.to_string().contains("to_dtype"), "{err}");
        }
    }
}
