//! The recipe's data-parallel mode ([`super::TrainConfig::distributed`]): what every rank must
//! agree on before training, and the model wrapped for one epoch.
//!
//! Invariants:
//! - Every rank calls these functions in the same order (they issue collectives), so a run with
//!   a group issues the same collectives on every rank; without a group they issue none.
//! - Decisions that could differ between ranks are taken by rank 0 and broadcast (the batch
//!   size) or checked to agree (whether a checkpoint is resumed); nothing that decides the
//!   number of steps is left to each rank.
//! - The small tensors of these agreements live on the run's device (NCCL reduces only CUDA
//!   tensors, MPI only host ones).
//! - The model is wrapped anew each epoch ([`replicate`]), after the epoch froze or unfroze its
//!   backbone, so `DistributedDataParallel` buckets exactly the parameters that train in it
//!   (frozen ones are skipped) and re-broadcasts rank 0's weights at each epoch start.

use super::config::TrainConfig;
use super::error::{Error, Result};
use kiln_autograd::{Module, Parameter, Tensor};
use kiln_distributed::{DdpOptions, DistributedDataParallel, ReduceOp};
use kiln_models::models::ResNet;
use kiln_models::{Act, Layer, LayerExt, Tracer};

/// The run's model as a [`Layer`] that `DistributedDataParallel` can own for one epoch while
/// the trainer keeps the model: it shares every parameter and buffer (tensors are handles).
pub(super) struct Shared<'a>(pub &'a ResNet);

impl Module for Shared<'_> {
    fn own_parameters(&self) -> Vec<(String, Parameter)> {
        self.0.named_parameters()
    }
    fn is_training(&self) -> bool {
        self.0.is_training()
    }
    /// The recipe sets the mode on the model itself before wrapping it; the wrapper holds no
    /// flag of its own.
    fn set_training_flag(&mut self, _training: bool) {}
}

impl Layer for Shared<'_> {
    fn type_name(&self) -> &'static str {
        self.0.type_name()
    }
    fn forward(&self, x: &Tensor) -> kiln_models::Result<Tensor> {
        self.0.forward(x)
    }
    fn trace(&self, tracer: &mut Tracer, x: &Act) -> kiln_models::Result<Act> {
        self.0.trace(tracer, x)
    }
    fn own_buffers(&self) -> Vec<(String, Tensor)> {
        self.0.named_buffers()
    }
    fn as_module(&self) -> &dyn Module {
        self
    }
    fn as_module_mut(&mut self) -> &mut dyn Module {
        self
    }
}

/// The number of ranks of the run (1 without a group).
pub(super) fn world_size(config: &TrainConfig) -> usize {
    config.distributed.as_ref().map_or(1, |d| d.0.world_size())
}

/// With `sync_bn` over more than one rank, makes every BatchNorm2d of `model` normalise with
/// the batch statistics of all ranks (one rank's own are already the whole batch's).
pub(super) fn convert_batch_norms(config: &TrainConfig, model: &mut ResNet) {
    if let (true, Some(d)) = (config.sync_bn, &config.distributed) {
        if d.0.world_size() > 1 {
            kiln_distributed::sync_bn::convert_sync_batchnorm(model, d.0.clone());
        }
    }
}

/// What ZeRO-1 would save per rank on `plan` over the run's ranks (`None` for one rank):
/// every trainable parameter sharded as `ZeroRedundancyOptimizer` shards them.
pub(super) fn zero1_saving(
    config: &TrainConfig,
    model: &ResNet,
    plan: &kiln_models::MemoryPlan,
) -> Option<kiln_distributed::zero::Zero1Saving> {
    let world = world_size(config);
    if world < 2 {
        return None;
    }
    let numels: Vec<usize> = model
        .named_parameters()
        .iter()
        .filter(|(_, p)| p.requires_grad())
        .map(|(_, p)| p.numel())
        .collect();
    Some(kiln_distributed::zero::zero1_saving(plan, &numels, world))
}

/// The model wrapped for data-parallel training (`None` without a group): rank 0's parameters
/// and buffers broadcast to every rank, the trainable ones bucketed with their hooks. Buffers
/// (BatchNorm's running statistics) are re-broadcast from rank 0 at each synced forward,
/// PyTorch's default; the batch statistics stay per rank unless `sync_bn` converted the
/// BatchNorms ([`convert_batch_norms`]).
pub(super) fn replicate<'a>(
    config: &TrainConfig,
    model: &'a ResNet,
) -> Result<Option<DistributedDataParallel<Shared<'a>>>> {
    let Some(d) = &config.distributed else {
        return Ok(None);
    };
    let ddp = DistributedDataParallel::new(Shared(model), d.0.clone(), DdpOptions::default())?;
    Ok(Some(ddp))
}

/// Whether every rank resumes: `local` (a checkpoint was found) on every rank, or on none.
/// Ranks that disagree (a run folder not shared by every host) fail with the fix.
pub(super) fn agree_on_resume(config: &TrainConfig, local: bool) -> Result<bool> {
    let Some(d) = &config.distributed else {
        return Ok(local);
    };
    let found = Tensor::from_vec(vec![local as i64], &[1], config.device)?;
    d.0.all_reduce(&found, ReduceOp::Sum)?;
    let found = found.to_vec::<i64>()?[0];
    let world = d.0.world_size() as i64;
    if found != 0 && found != world {
        return Err(Error::Config(format!(
            "--resume: {found} of {world} ranks see the checkpoint in --run-dir {} (rank {} {}); \
             every rank resumes from rank 0's checkpoint, so the run folder must be on a file \
             system every host shares",
            config.run_dir.display(),
            d.0.rank(),
            if local { "does" } else { "does not" }
        )));
    }
    Ok(found == world)
}

/// Rank 0's batch size on every rank (an automatic one depends on each device's free memory,
/// and every rank must take the same number of steps).
pub(super) fn agree_on_batch_size(config: &TrainConfig, batch_size: usize) -> Result<usize> {
    let Some(d) = &config.distributed else {
        return Ok(batch_size);
    };
    let value = i64::try_from(batch_size)
        .map_err(|_| Error::Config(format!("batch size {batch_size} is too large")))?;
    let t = Tensor::from_vec(vec![value], &[1], config.device)?;
    d.0.broadcast(&t, 0)?;
    Ok(t.to_vec::<i64>()?[0] as usize)
}

/// The mean of `value` over the ranks (`value` itself without a group).
pub(super) fn mean_over_ranks(config: &TrainConfig, value: f64) -> Result<f64> {
    let Some(d) = &config.distributed else {
        return Ok(value);
    };
    let t = Tensor::from_vec(vec![value], &[1], config.device)?;
    d.0.all_reduce(&t, ReduceOp::Avg)?;
    Ok(t.to_vec::<f64>()?[0])
}

/// Overwrites every buffer (BatchNorm's running statistics) with rank 0's, at the end of an
/// epoch's training: DDP broadcasts them at the start of each synced forward, and that forward
/// then updates them from each rank's own batch, so without this the ranks would validate and
/// end with different statistics.
pub(super) fn sync_buffers(config: &TrainConfig, model: &ResNet) -> Result<()> {
    let Some(d) = &config.distributed else {
        return Ok(());
    };
    for (_, buffer) in model.named_buffers() {
        kiln_autograd::no_grad(|| d.0.broadcast(&buffer, 0))?;
    }
    Ok(())
}
