//! `BatchNorm2d` (with running-statistics buffers) and `LayerNorm`.

use crate::error::{config_err, input_err};
use crate::functional;
use crate::init;
use crate::layer::{any_trainable, BatchStatsReduce};
use crate::trace::{Act, Tracer};
use crate::{layer_casts, module_tree, Layer, Result};
use kiln_autograd::{no_grad, DType, Device, Module, Parameter, Tensor};
use std::sync::Arc;

/// Batch normalisation over `[N, C, H, W]` (`torch.nn.BatchNorm2d`, affine, tracking running
/// stats): weight 1, bias 0, buffers `running_mean` 0, `running_var` 1, `num_batches_tracked` 0
/// (an `i64` scalar), `eps = 1e-5`, `momentum = 0.1`.
///
/// With a batch-statistics reduction set ([`crate::set_batch_stats_reduce`]; kiln-distributed's
/// `SyncBatchNorm`), training normalises with the mean and variance of the batches of every
/// participant: the per-channel sums of `x` and `x^2` and the element count go through the
/// reduction, and the running statistics are updated from the global mean and unbiased
/// variance, so they are the same everywhere. Evaluation never reduces.
#[derive(Debug)]
pub struct BatchNorm2d {
    /// Scale `[C]`.
    pub weight: Parameter,
    /// Shift `[C]`.
    pub bias: Parameter,
    /// Running mean `[C]` (a buffer, updated in training mode).
    pub running_mean: Tensor,
    /// Running (unbiased) variance `[C]` (a buffer).
    pub running_var: Tensor,
    /// Training batches seen (a 0-d `i64` buffer).
    pub num_batches_tracked: Tensor,
    /// Added to the variance.
    pub eps: f64,
    /// Weight of the new batch statistics in the running ones.
    pub momentum: f64,
    training: bool,
    stats_reduce: Option<Arc<dyn BatchStatsReduce>>,
}

impl BatchNorm2d {
    /// `BatchNorm2d(num_features)`.
    pub fn new(num_features: usize) -> Result<Self> {
        if num_features == 0 {
            return Err(config_err("BatchNorm2d", "num_features must be positive"));
        }
        let c = [num_features];
        let _parameters = crate::scope::parameters();
        Ok(BatchNorm2d {
            weight: init::constant(&c, 1.0)?,
            bias: init::constant(&c, 0.0)?,
            running_mean: Tensor::zeros(&c, DType::F32, Device::Cpu)?,
            running_var: Tensor::ones(&c, DType::F32, Device::Cpu)?,
            num_batches_tracked: Tensor::zeros(&[], DType::I64, Device::Cpu)?,
            eps: 1e-5,
            momentum: 0.1,
            training: true,
            stats_reduce: None,
        })
    }

    /// A layer sharing this one's parameter and buffer handles, eps, momentum and mode, with
    /// `stats_reduce` as its batch-statistics reduction (an optimizer built on this layer's
    /// parameters keeps working on the new one).
    pub fn shared_with(&self, stats_reduce: Option<Arc<dyn BatchStatsReduce>>) -> BatchNorm2d {
        BatchNorm2d {
            weight: self.weight.clone(),
            bias: self.bias.clone(),
            running_mean: self.running_mean.clone(),
            running_var: self.running_var.clone(),
            num_batches_tracked: self.num_batches_tracked.clone(),
            eps: self.eps,
            momentum: self.momentum,
            training: self.training,
            stats_reduce,
        }
    }

    /// Training forward with the statistics of every participant of `reduce`.
    fn forward_reduced(&self, x: &Tensor, reduce: &dyn BatchStatsReduce) -> Result<Tensor> {
        let c = self.weight.shape()[0];
        let s = x.shape();
        let count = s[0] * s[2] * s[3];
        let sum = x.sum(&[0, 2, 3], false)?;
        let sumsq = x.square()?.sum(&[0, 2, 3], false)?;
        let n = Tensor::full(&[1], count as f64, x.dtype(), x.device())?;
        let global = reduce.sum(&Tensor::cat(&[sum, sumsq, n], 0)?)?;
        let total = global.narrow(0, 2 * c, 1)?;
        let mean = global.narrow(0, 0, c)?.div(&total)?;
        let var = global.narrow(0, c, c)?.div(&total)?.sub(&mean.square()?)?;
        let total_count = total.item()?;
        if total_count < 2.0 {
            return Err(input_err(
                "BatchNorm2d",
                "training needs more than 1 value per channel over all participants to \
                 estimate a variance; use a larger batch or input, or evaluation mode",
            ));
        }
        no_grad(|| -> Result<()> {
            let m = self.momentum;
            let unbiased = var.mul_scalar(total_count / (total_count - 1.0))?;
            let blend = |running: &Tensor, batch: &Tensor| -> Result<()> {
                let next = running.mul_scalar(1.0 - m)?.add(&batch.mul_scalar(m)?)?;
                Ok(running.copy_(&next.to_dtype(running.dtype())?)?)
            };
            blend(&self.running_mean, &mean)?;
            blend(&self.running_var, &unbiased)
        })?;
        let shape = [1, c, 1, 1];
        let inv_std = var.add_scalar(self.eps)?.rsqrt()?;
        let scale = inv_std.mul(&self.weight)?.reshape_to(&shape)?;
        Ok(x.sub(&mean.reshape_to(&shape)?)?
            .mul(&scale)?
            .add(&self.bias.reshape_to(&shape)?)?)
    }

    fn check(&self, x: &[usize]) -> Result<()> {
        let c = self.weight.shape()[0];
        if x.len() != 4 || x[1] != c {
            return Err(input_err(
                "BatchNorm2d",
                format!("expected an [N, {c}, H, W] input, got {x:?}"),
            ));
        }
        Ok(())
    }
}

impl Module for BatchNorm2d {
    fn own_parameters(&self) -> Vec<(String, Parameter)> {
        vec![
            ("weight".to_string(), self.weight.clone()),
            ("bias".to_string(), self.bias.clone()),
        ]
    }
    module_tree!();
}

impl Layer for BatchNorm2d {
    fn type_name(&self) -> &'static str {
        "BatchNorm2d"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.check(x.shape())?;
        if self.training {
            let _g = kiln_autograd::NoGradGuard::new();
            let next = self.num_batches_tracked.add_scalar(1.0)?;
            self.num_batches_tracked.copy_(&next)?;
        }
        if let (true, Some(reduce)) = (self.training, &self.stats_reduce) {
            return self.forward_reduced(x, reduce.as_ref());
        }
        functional::batch_norm(
            x,
            &self.running_mean,
            &self.running_var,
            Some(&self.weight),
            Some(&self.bias),
            self.training,
            self.momentum,
            self.eps,
        )
    }

    fn trace(&self, tracer: &mut Tracer, x: &Act) -> Result<Act> {
        self.check(x.shape())?;
        // Backward needs the input and, in training, the batch mean and inverse std per channel.
        let trainable = any_trainable([&self.weight, &self.bias]);
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

    fn batch_stats_reduce_mut(&mut self) -> Option<&mut Option<Arc<dyn BatchStatsReduce>>> {
        Some(&mut self.stats_reduce)
    }

    layer_casts!();
}

/// Layer normalisation over the trailing dims (`torch.nn.LayerNorm`): weight 1, bias 0,
/// `eps = 1e-5` unless set.
#[derive(Debug)]
pub struct LayerNorm {
    /// The trailing dims normalised over.
    pub normalized_shape: Vec<usize>,
    /// Scale, `normalized_shape`.
    pub weight: Parameter,
    /// Shift, `normalized_shape`.
    pub bias: Parameter,
    /// Added to the variance.
    pub eps: f64,
    training: bool,
}

impl LayerNorm {
    /// `LayerNorm(normalized_shape, eps)`.
    pub fn new(normalized_shape: &[usize], eps: f64) -> Result<Self> {
        if normalized_shape.is_empty() || normalized_shape.contains(&0) {
            return Err(config_err(
                "LayerNorm",
                format!("normalized_shape {normalized_shape:?} must be non-empty and positive"),
            ));
        }
        Ok(LayerNorm {
            normalized_shape: normalized_shape.to_vec(),
            weight: init::constant(normalized_shape, 1.0)?,
            bias: init::constant(normalized_shape, 0.0)?,
            eps,
            training: true,
        })
    }

    fn check(&self, x: &[usize]) -> Result<()> {
        let k = self.normalized_shape.len();
        if x.len() < k || x[x.len() - k..] != self.normalized_shape[..] {
            return Err(input_err(
                "LayerNorm",
                format!(
                    "input {x:?} must end with the normalized shape {:?}",
                    self.normalized_shape
                ),
            ));
        }
        Ok(())
    }
}

impl Module for LayerNorm {
    fn own_parameters(&self) -> Vec<(String, Parameter)> {
        vec![
            ("weight".to_string(), self.weight.clone()),
            ("bias".to_string(), self.bias.clone()),
        ]
    }
    module_tree!();
}

impl Layer for LayerNorm {
    fn type_name(&self) -> &'static str {
        "LayerNorm"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.check(x.shape())?;
        functional::layer_norm(
            x,
            &self.normalized_shape,
            Some(&self.weight),
            Some(&self.bias),
            self.eps,
        )
    }

    fn trace(&self, tracer: &mut Tracer, x: &Act) -> Result<Act> {
        self.check(x.shape())?;
        // Backward needs the input and the mean and inverse std of each normalised row.
        let trainable = any_trainable([&self.weight, &self.bias]);
        let out = tracer.output(&[x], x.shape(), x.dtype(), trainable);
        if out.requires_grad() {
            tracer.save(x);
            let rows = &x.shape()[..x.shape().len() - self.normalized_shape.len()];
            tracer.save_new(rows, DType::F32);
            tracer.save_new(rows, DType::F32);
        }
        Ok(out)
    }

    layer_casts!();
}
