//! What the recipe tells its caller: the [`Setup`] decided before the first step, one
//! [`EpochReport`] per epoch through an [`Observer`], and the [`Outcome`] of the run.

use kiln_models::models::ResNet;
use kiln_optim::GradScalerState;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// One epoch's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochReport {
    /// Epoch number, from 1.
    pub epoch: usize,
    /// Whether the backbone was frozen.
    pub frozen: bool,
    /// Mean training loss.
    pub train_loss: f64,
    /// Mean validation loss.
    pub val_loss: f64,
    /// Validation accuracy in `[0, 1]`.
    pub val_accuracy: f64,
    /// The lrs (backbone, head) at the end of the epoch.
    pub lr: [f64; 2],
    /// Mean gradient norm before clipping.
    pub grad_norm: f64,
    /// Bytes allocated / reserved on the device after `empty_cache`, and the epoch's peak.
    pub memory: [usize; 3],
    /// Training samples per second.
    pub samples_per_sec: f64,
    /// Wall seconds of the epoch (training and validation).
    pub seconds: f64,
}

/// What [`train`](super::train) decided before the first step.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The model summary (torchinfo's table).
    pub summary: String,
    /// The training memory plan.
    pub plan: kiln_models::MemoryPlan,
    /// Memory the automatic batch size was planned against (`None` when given by hand).
    pub budget_bytes: Option<usize>,
    /// The batch size used.
    pub batch_size: usize,
    /// Largest batch the plan allows in the budget.
    pub plan_max_batch: Option<usize>,
    /// Batches per epoch.
    pub batches_per_epoch: usize,
    /// Epochs already done (resumed run).
    pub resumed_epochs: usize,
    /// The checkpoint `resume` asked for but did not find, so the run started from scratch
    /// (`None` when not resuming, or when the checkpoint was there).
    pub resume_missing: Option<std::path::PathBuf>,
    /// Training / validation samples.
    pub samples: (usize, usize),
    /// Whether the training images are read from disk as they are used (a folder too large to
    /// hold in memory) rather than held in memory.
    pub data_on_disk: bool,
    /// The pretrained backbone loaded before training (`None` without `pretrained`, and on
    /// resume, where the weights come from the checkpoint).
    pub pretrained: Option<super::model::PretrainedReport>,
    /// A data-parallel run of more than one rank: what ZeRO stage 1
    /// (`kiln_distributed::ZeroRedundancyOptimizer`) would make of `plan` on this many ranks,
    /// the optimizer state of each rank's shard instead of all of it (`None` for one rank).
    pub zero1: Option<kiln_distributed::zero::Zero1Saving>,
}

/// Hooks for progress display; every method has an empty default.
pub trait Observer {
    /// Once, before training.
    fn setup(&mut self, _setup: &Setup) {}
    /// At the start of an epoch with `batches` batches left.
    fn epoch_start(&mut self, _epoch: usize, _batches: usize) {}
    /// After each batch: its size and loss.
    fn batch(&mut self, _samples: usize, _loss: f64) {}
    /// After each epoch.
    fn epoch_end(&mut self, _report: &EpochReport) {}
}

/// An [`Observer`] that shows nothing.
pub struct Quiet;
impl Observer for Quiet {}

/// What a finished (or stopped) run returns.
#[derive(Debug)]
pub struct Outcome {
    /// Every epoch's report, including those of the runs it resumed.
    pub history: Vec<EpochReport>,
    /// The loss of every batch this call trained (not the resumed part), for comparisons.
    pub batch_losses: Vec<f64>,
    /// The trained model.
    pub model: ResNet,
    /// The checkpoint file.
    pub checkpoint: PathBuf,
    /// The loss scaler's final state (f16 `amp` runs only).
    pub grad_scaler: Option<GradScalerState>,
}
