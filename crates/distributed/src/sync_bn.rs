//! [`SyncBatchNorm`]: BatchNorm2d whose batch statistics span every rank (PyTorch's
//! `nn.SyncBatchNorm`).
//!
//! Invariants: in training, each rank sums its `x` and `x^2` per channel and counts its elements;
//! one all-reduce (a differentiable op whose backward is an all-reduce of the gradient) makes
//! the totals global, so every rank normalises with the statistics of the whole global batch and
//! backward carries each rank's share of the statistics' gradient to every other rank. The
//! running statistics are updated from the global mean and unbiased variance, so they are the
//! same on every rank. Every rank must run the same forwards and backwards through it (each
//! issues one collective per forward and one per backward). In evaluation it is BatchNorm2d.

use crate::{ProcessGroup, ReduceOp, Result};
use kiln_autograd::{no_grad, DType, Module, Parameter, Tensor};
use kiln_models::layers::BatchNorm2d;
use kiln_models::{functional, Act, Layer, Tracer};
use std::sync::Arc;

/// `all_reduce(Sum)` as a differentiable op: the output is the sum over ranks of `x`, and the
/// gradient of `x` is the sum over ranks of the output's gradient.
pub fn all_reduce_sum_differentiable(group: &Arc<dyn ProcessGroup>, x: &Tensor) -> Result<Tensor> {
    let out = no_grad(|| x.detach().copy_data())?;
    no_grad(|| group.all_reduce(&out, ReduceOp::Sum))?;
    let group = group.clone();
    Ok(Tensor::record_op(
        "AllReduceSumBackward",
        &[x],
        &out,
        move |_| {
            Box::new(move |grad: &Tensor| {
                let total = grad.contiguous()?.copy_data()?;
                group
                    .all_reduce(&total, ReduceOp::Sum)
                    .map_err(|e| kiln_autograd::Error::Autograd(e.to_string()))?;
                Ok(vec![Some(total)])
            })
        },
    ))
}

/// BatchNorm2d over the global batch of every rank.
pub struct SyncBatchNorm {
    /// Scale `[C]`.
    pub weight: Parameter,
    /// Shift `[C]`.
    pub bias: Parameter,
    /// Running mean `[C]` (a buffer, the same on every rank).
    pub running_mean: Tensor,
    /// Running (unbiased) variance `[C]`.
    pub running_var: Tensor,
    /// Training batches seen (0-d `i64`).
    pub num_batches_tracked: Tensor,
    /// Added to the variance.
    pub eps: f64,
    /// Weight of the new batch statistics in the running ones.
    pub momentum: f64,
    training: bool,
    group: Arc<dyn ProcessGroup>,
}

impl SyncBatchNorm {
    /// `SyncBatchNorm(num_features)` over `group` (weight 1, bias 0, eps 1e-5, momentum 0.1).
    pub fn new(num_features: usize, group: Arc<dyn ProcessGroup>) -> Result<Self> {
        Self::from_batch_norm(&BatchNorm2d::new(num_features)?, group)
    }

    /// The synchronised version of `bn` (PyTorch's `convert_sync_batchnorm` for one layer): it
    /// shares `bn`'s parameter and buffer handles, so an optimizer built on them keeps working.
    pub fn from_batch_norm(bn: &BatchNorm2d, group: Arc<dyn ProcessGroup>) -> Result<Self> {
        Ok(SyncBatchNorm {
            weight: bn.weight.clone(),
            bias: bn.bias.clone(),
            running_mean: bn.running_mean.clone(),
            running_var: bn.running_var.clone(),
            num_batches_tracked: bn.num_batches_tracked.clone(),
            eps: bn.eps,
            momentum: bn.momentum,
            training: bn.is_training(),
            group,
        })
    }

    fn check(&self, x: &[usize]) -> kiln_models::Result<()> {
        let c = self.weight.shape()[0];
        if x.len() != 4 || x[1] != c {
            return Err(kiln_models::Error::Input {
                layer: "SyncBatchNorm",
                msg: format!("expected an [N, {c}, H, W] input, got {x:?}"),
            });
        }
        Ok(())
    }

    fn forward_training(&self, x: &Tensor) -> Result<Tensor> {
        let c = self.weight.shape()[0];
        let s = x.shape();
        let count = s[0] * s[2] * s[3];
        let sum = x.sum(&[0, 2, 3], false)?;
        let sumsq = x.square()?.sum(&[0, 2, 3], false)?;
        let n = Tensor::full(&[1], count as f64, x.dtype(), x.device())?;
        let global =
            all_reduce_sum_differentiable(&self.group, &Tensor::cat(&[sum, sumsq, n], 0)?)?;
        let total = global.narrow(0, 2 * c, 1)?;
        let mean = global.narrow(0, 0, c)?.div(&total)?;
        let var = global.narrow(0, c, c)?.div(&total)?.sub(&mean.square()?)?;
        let total_count = total.item()?;
        if total_count < 2.0 {
            return Err(kiln_models::Error::Input {
                layer: "SyncBatchNorm",
                msg: "training needs more than 1 value per channel over all ranks to estimate a \
                      variance; use a larger batch or input, or evaluation mode"
                    .into(),
            }
            .into());
        }
        no_grad(|| -> Result<()> {
            let m = self.momentum;
            let unbiased = var.mul_scalar(total_count / (total_count - 1.0))?;
            let rm = self
                .running_mean
                .mul_scalar(1.0 - m)?
                .add(&mean.mul_scalar(m)?)?;
            let rv = self
                .running_var
                .mul_scalar(1.0 - m)?
                .add(&unbiased.mul_scalar(m)?)?;
            self.running_mean
                .copy_(&rm.to_dtype(self.running_mean.dtype())?)?;
            self.running_var
                .copy_(&rv.to_dtype(self.running_var.dtype())?)?;
            let next = self.num_batches_tracked.add_scalar(1.0)?;
            self.num_batches_tracked.copy_(&next)?;
            Ok(())
        })?;
        let shape = [1, c, 1, 1];
        let inv_std = var.add_scalar(self.eps)?.rsqrt()?;
        let scale = inv_std.mul(&self.weight)?.reshape_to(&shape)?;
        Ok(x.sub(&mean.reshape_to(&shape)?)?
            .mul(&scale)?
            .add(&self.bias.reshape_to(&shape)?)?)
    }
}

fn model_err(e: crate::Error) -> kiln_models::Error {
    match e {
        crate::Error::Model(m) => m,
        crate::Error::Autograd(a) => kiln_models::Error::Tensor(a),
        other => kiln_models::Error::Tensor(kiln_autograd::Error::Autograd(other.to_string())),
    }
}

impl Module for SyncBatchNorm {
    fn own_parameters(&self) -> Vec<(String, Parameter)> {
        vec![
            ("weight".to_string(), self.weight.clone()),
            ("bias".to_string(), self.bias.clone()),
        ]
    }
    kiln_models::module_tree!();
}

impl Layer for SyncBatchNorm {
    fn type_name(&self) -> &'static str {
        "SyncBatchNorm"
    }

    fn forward(&self, x: &Tensor) -> kiln_models::Result<Tensor> {
        self.check(x.shape())?;
        if self.training {
            return self.forward_training(x).map_err(model_err);
        }
        functional::batch_norm(
            x,
            &self.running_mean,
            &self.running_var,
            Some(&self.weight),
            Some(&self.bias),
            false,
            self.momentum,
            self.eps,
        )
    }

    fn trace(&self, tracer: &mut Tracer, x: &Act) -> kiln_models::Result<Act> {
        self.check(x.shape())?;
        let trainable = self.weight.requires_grad() || self.bias.requires_grad();
        let out = tracer.output(&[x], x.shape(), x.dtype(), trainable);
        if out.requires_grad() {
            tracer.save(x);
            if self.training {
                let c = [x.shape()[1]];
                tracer.save_new(&c, DType::F32);
                tracer.save_new(&c, DType::F32);
            }
        }
        Ok(out)
    }

    fn own_buffers(&self) -> Vec<(String, Tensor)> {
        vec![
            ("running_mean".to_string(), self.running_mean.clone()),
            ("running_var".to_string(), self.running_var.clone()),
            (
                "num_batches_tracked".to_string(),
                self.num_batches_tracked.clone(),
            ),
        ]
    }

    kiln_models::layer_casts!();
}
