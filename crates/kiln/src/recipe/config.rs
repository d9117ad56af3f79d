//! [`TrainConfig`], every knob of the recipe, with the example's defaults, and the checks that
//! refuse settings which cannot work before anything is built or written.

use super::error::{Error, Result};
use super::model::Arch;
use kiln_autograd::{DType, Device};
use kiln_data::{DataSource, NormalizeChoice};
use kiln_distributed::ProcessGroup;
use kiln_optim::GradScalerOptions;
use std::path::PathBuf;
use std::sync::Arc;

/// The process group of a data-parallel run ([`TrainConfig::distributed`]): this process is one
/// of `world_size` ranks, each training on its shard of every epoch with the same model.
#[derive(Clone)]
pub struct Distributed(pub Arc<dyn ProcessGroup>);

impl std::fmt::Debug for Distributed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Distributed(rank {} of {}, {:?})",
            self.0.rank(),
            self.0.world_size(),
            self.0.backend()
        )
    }
}

/// Every knob of [`train`](super::train); [`TrainConfig::default`] is the example's defaults.
#[derive(Debug, Clone)]
pub struct TrainConfig {
    /// Epochs of the whole schedule.
    pub epochs: usize,
    /// Stop after this many epochs (a checkpoint is written), as if interrupted; `None` runs all.
    pub stop_after: Option<usize>,
    /// Batch size; `None` picks the largest the memory plan allows, capped at `max_auto_batch`.
    pub batch_size: Option<usize>,
    /// Cap of the automatic batch size.
    pub max_auto_batch: usize,
    /// Peak learning rate of the head; the backbone's is `lr * backbone_lr_factor`.
    pub lr: f64,
    /// The backbone's lr relative to the head's.
    pub backbone_lr_factor: f64,
    /// AdamW weight decay, shared by both groups.
    pub weight_decay: f64,
    /// Fraction of all optimizer steps spent warming up linearly from `lr / 10`.
    pub warmup_fraction: f64,
    /// Where tensors live.
    pub device: Device,
    /// Seed of the init, the data set, the shuffle and the augmentation.
    pub seed: u64,
    /// The run folder (checkpoint, logs, plot).
    pub run_dir: PathBuf,
    /// The data.
    pub data: DataSource,
    /// Epochs with the backbone frozen (only `fc` trains).
    pub freeze_epochs: usize,
    /// Batches whose gradients add up to one optimizer step.
    pub accum_steps: usize,
    /// Global gradient-norm clipping threshold.
    pub max_grad_norm: f64,
    /// Mixed precision: forward and loss under `autocast(amp_dtype)`.
    pub amp: bool,
    /// The autocast dtype of `amp`: `BF16` (no loss scaling) or `F16` (with a `GradScaler`).
    pub amp_dtype: DType,
    /// The `GradScaler`'s options when `amp_dtype` is `F16` (PyTorch's defaults). The scaler's
    /// state (scale, growth tracker) is checkpointed, so an f16 run resumes bit for bit too.
    pub grad_scaler: GradScalerOptions,
    /// Continue from `run_dir/ckpt.safetensors` when it exists.
    pub resume: bool,
    /// The kind of ResNet (`--model`).
    pub model: Arch,
    /// Start from these weights (`--pretrained`: a `torch.save` state dict or safetensors with
    /// torchvision's names; its head is replaced for the data's classes). Needs a torchvision
    /// `model`; its width is the file's, `width` and `blocks` are not used.
    pub pretrained: Option<PathBuf>,
    /// Width and depth of the network (channels, size and classes come from the data).
    pub width: usize,
    /// Blocks per stage of the CIFAR ResNet (a torchvision `model` has its own).
    pub blocks: [usize; 4],
    /// Per-channel normalisation of both splits (`--normalize`): by default the data source's
    /// rule (ImageNet's constants for a folder fine-tuned from `pretrained` weights). Recorded
    /// in the checkpoint; a resumed run must normalise as the checkpoint does.
    pub normalize: NormalizeChoice,
    /// Random crop and flip on the training set (the data source's default augmentation).
    pub augment: bool,
    /// Batches the loader's worker prepares ahead.
    pub prefetch_batches: usize,
    /// Record the allocation history of the whole run in a ring of this many events and write
    /// it as `memory_snapshot.pickle` (PyTorch's memory_viz format) after every epoch; `None`
    /// records only the step `memory.svg` pictures.
    pub memory_history: Option<usize>,
    /// Data-parallel training over this group (`--distributed`): the model wrapped in
    /// `DistributedDataParallel`, the training set sharded by a `DistributedSampler`,
    /// `batch_size` per rank, and only rank 0 writes to `run_dir`. `None`: one process.
    pub distributed: Option<Distributed>,
    /// With `distributed` over more than one rank: every BatchNorm2d normalises with the batch
    /// statistics of all ranks (`--sync-bn`, PyTorch's `SyncBatchNorm`), so a step of N ranks
    /// of batch B computes what one process of batch N * B computes. Off: each rank's own.
    pub sync_bn: bool,
}

impl TrainConfig {
    /// True on the process that writes the run folder and reports: rank 0, or the only one.
    pub fn is_writer(&self) -> bool {
        self.distributed.as_ref().is_none_or(|d| d.0.rank() == 0)
    }
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            epochs: 4,
            stop_after: None,
            batch_size: None,
            max_auto_batch: 128,
            lr: 4e-3,
            backbone_lr_factor: 0.5,
            weight_decay: 5e-4,
            warmup_fraction: 0.1,
            device: Device::Cpu,
            seed: 0,
            run_dir: PathBuf::from("runs/train"),
            data: DataSource::synthetic(),
            freeze_epochs: 1,
            accum_steps: 1,
            max_grad_norm: 2.0,
            amp: false,
            amp_dtype: DType::BF16,
            grad_scaler: GradScalerOptions::default(),
            resume: false,
            model: Arch::CifarResNet,
            pretrained: None,
            width: 16,
            blocks: [1, 1, 1, 1],
            normalize: NormalizeChoice::Source,
            augment: true,
            prefetch_batches: 2,
            memory_history: None,
            distributed: None,
            sync_bn: false,
        }
    }
}

/// Refuses settings that cannot work, naming the flag to change.
pub(super) fn check(config: &TrainConfig) -> Result<()> {
    let bad = |m: String| Err(Error::Config(m));
    if config.amp && !matches!(config.amp_dtype, DType::BF16 | DType::F16) {
        return bad(format!(
            "--amp-dtype {}: mixed precision autocasts to a 16-bit float; use bf16 or f16",
            config.amp_dtype
        ));
    }
    if config.memory_history == Some(0) {
        return bad(
            "--memory-history 0 keeps no event; pass the ring size (100000 is PyTorch's default)"
                .into(),
        );
    }
    if config.epochs == 0 || config.accum_steps == 0 {
        return bad("epochs and accum-steps must be at least 1".into());
    }
    if !(config.lr > 0.0 && config.max_grad_norm > 0.0) {
        return bad("lr and max-grad-norm must be positive".into());
    }
    if !config.lr.is_finite() {
        return bad(format!(
            "--lr {}: pass a finite learning rate (the head's peak, e.g. 1e-3)",
            config.lr
        ));
    }
    if !(0.0..1.0).contains(&config.warmup_fraction) {
        return bad(format!(
            "warmup_fraction {:?}: the share of the optimizer steps spent warming up before the \
             cosine decay; pass a value of at least 0 and below 1 (0.1 is the default)",
            config.warmup_fraction
        ));
    }
    if config.sync_bn && config.distributed.is_none() {
        return bad(
            "--sync-bn shares BatchNorm's statistics between the ranks of a data-parallel run; \
             add --distributed (under mpirun or torchrun), or drop --sync-bn"
                .into(),
        );
    }
    if config.pretrained.is_some() && config.model.torchvision_blocks().is_none() {
        return bad(format!(
            "--pretrained needs one of torchvision's ResNets, not --model {}; pass --model \
             resnet18, resnet34 or resnet50 (the one the weights were trained as)",
            config.model
        ));
    }
    if !(config.backbone_lr_factor >= 0.0 && config.backbone_lr_factor.is_finite()) {
        return bad(format!(
            "--backbone-lr-factor {:?}: the backbone's lr is the head's times this factor; pass \
             a finite factor of at least 0",
            config.backbone_lr_factor
        ));
    }
    if config.freeze_epochs >= config.epochs {
        return bad(format!(
            "freeze-epochs {} leaves no epoch to train the backbone in {} epoch(s); pass a \
             smaller --freeze-epochs or more --epochs",
            config.freeze_epochs, config.epochs
        ));
    }
    Ok(())
}
