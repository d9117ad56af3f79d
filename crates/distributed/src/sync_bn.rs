//! [`SyncBatchNorm`]: BatchNorm2d whose batch statistics span every rank (PyTorch's
//! `nn.SyncBatchNorm`), and [`convert_sync_batchnorm`], which makes every BatchNorm2d of a model
//! one.
//!
//! Invariants: in training, each rank sums its `x` and `x^2` per channel and counts its elements;
//! one all-reduce (a differentiable op whose backward is an all-reduce of the gradient) makes
//! the totals global, so every rank normalises with the statistics of the whole global batch and
//! backward carries each rank's share of the statistics' gradient to every other rank. The
//! arithmetic (normalisation, running statistics from the global mean and unbiased variance) is
//! kiln-models' `BatchNorm2d` with a batch-statistics reduction ([`GroupStatsSum`]); this file
//! only supplies the reduction. Every rank must run the same forwards and backwards through it
//! (each issues one collective per forward and one per backward). In evaluation it is
//! BatchNorm2d.

use crate::{ProcessGroup, ReduceOp, Result};
use kiln_autograd::{no_grad, Module, Parameter, Tensor};
use kiln_models::layers::BatchNorm2d;
use kiln_models::{set_batch_stats_reduce, Act, BatchStatsReduce, Layer, Tracer};
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

/// The batch-statistics reduction of [`SyncBatchNorm`]: a differentiable all-reduce over a
/// process group.
pub struct GroupStatsSum(pub Arc<dyn ProcessGroup>);

impl std::fmt::Debug for GroupStatsSum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GroupStatsSum(rank {} of {})",
            self.0.rank(),
            self.0.world_size()
        )
    }
}

impl BatchStatsReduce for GroupStatsSum {
    fn sum(&self, local: &Tensor) -> kiln_models::Result<Tensor> {
        all_reduce_sum_differentiable(&self.0, local).map_err(model_err)
    }
}

/// Makes every BatchNorm2d of `model` normalise with the statistics of every rank of `group`
/// (PyTorch's `SyncBatchNorm.convert_sync_batchnorm`, in place: the layers keep their handles);
/// returns how many layers it converted.
pub fn convert_sync_batchnorm(model: &mut dyn Layer, group: Arc<dyn ProcessGroup>) -> usize {
    set_batch_stats_reduce(model, Some(Arc::new(GroupStatsSum(group))))
}

/// BatchNorm2d over the global batch of every rank.
pub struct SyncBatchNorm {
    bn: BatchNorm2d,
}

impl SyncBatchNorm {
    /// `SyncBatchNorm(num_features)` over `group` (weight 1, bias 0, eps 1e-5, momentum 0.1).
    pub fn new(num_features: usize, group: Arc<dyn ProcessGroup>) -> Result<Self> {
        Ok(Self::from_batch_norm(
            &BatchNorm2d::new(num_features)?,
            group,
        ))
    }

    /// The synchronised version of `bn` (PyTorch's `convert_sync_batchnorm` for one layer): it
    /// shares `bn`'s parameter and buffer handles, so an optimizer built on them keeps working.
    pub fn from_batch_norm(bn: &BatchNorm2d, group: Arc<dyn ProcessGroup>) -> Self {
        SyncBatchNorm {
            bn: bn.shared_with(Some(Arc::new(GroupStatsSum(group)))),
        }
    }

    /// The underlying layer (its parameters, buffers, eps and momentum).
    pub fn batch_norm(&self) -> &BatchNorm2d {
        &self.bn
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
        self.bn.own_parameters()
    }
    fn is_training(&self) -> bool {
        self.bn.is_training()
    }
    fn set_training_flag(&mut self, training: bool) {
        self.bn.set_training_flag(training);
    }
}

impl Layer for SyncBatchNorm {
    fn type_name(&self) -> &'static str {
        "SyncBatchNorm"
    }

    fn forward(&self, x: &Tensor) -> kiln_models::Result<Tensor> {
        self.bn.forward(x)
    }

    fn trace(&self, tracer: &mut Tracer, x: &Act) -> kiln_models::Result<Act> {
        self.bn.trace(tracer, x)
    }

    fn own_buffers(&self) -> Vec<(String, Tensor)> {
        self.bn.own_buffers()
    }

    fn batch_stats_reduce_mut(&mut self) -> Option<&mut Option<Arc<dyn BatchStatsReduce>>> {
        self.bn.batch_stats_reduce_mut()
    }

    kiln_models::layer_casts!();
}
