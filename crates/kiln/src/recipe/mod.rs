//! The training recipe behind `cargo run --example train`, as a library so tests and other
//! programs can run it: [`train`] takes a [`TrainConfig`] and a [`Observer`] (the example's
//! progress bar) and runs every practice of the guide in one loop:
//!
//! - a `ResNet` (CIFAR stem) sized by [`ModelConfig`], its summary and training memory
//!   plan, and the batch size the plan allows on the device (capped);
//! - the backbone frozen for the first `freeze_epochs` epochs, then trained with its own, smaller
//!   learning rate (two AdamW parameter groups, shared weight decay);
//! - gradient accumulation over `accum_steps` batches, clipping by global norm (the norm is
//!   logged), a linear warm-up then cosine decay (`SequentialLR`) stepped per optimizer step;
//! - validation under `no_grad` in eval mode after each epoch, then `empty_cache()`;
//! - TensorBoard events, a CSV and an SVG plot in the run folder, and a checkpoint after every
//!   epoch ([`checkpoint`]) from which `resume` continues bit for bit;
//! - the model moved to the chosen device once, before the optimizer is built (so its state is
//!   created there too), and batches delivered there by the loader;
//! - optional mixed precision: forward and loss under `autocast` (bf16 by default; matmuls and
//!   convolutions in 16 bits, softmax, norms and reductions in f32) while parameters, gradients,
//!   optimizer state and checkpoints stay f32; with f16 a `GradScaler` scales the loss, unscales
//!   before clipping and skips steps whose gradients overflowed. bf16 has f32's range and needs
//!   no scaling. It runs on the CPU too (slowly: the CPU kernels compute in f32 after casting).

pub mod checkpoint;
pub mod model;
mod predict;

pub use model::ModelConfig;
pub use predict::{predict, top_k};

use checkpoint::{ModelInfo, Progress, Saved};
use kiln_autograd::{no_grad, AutocastGuard, DType, Device, Module};
use kiln_data::{DataLoader, DataLoaderConfig, DataSource};
use kiln_losses::{cross_entropy, CrossEntropyOptions};
use kiln_models::models::ResNet;
use kiln_models::{Freeze, Layer, LayerExt, OptimizerKind};
use kiln_optim::{
    clip_grad_norm_, AdamOptions, AdamW, GradScaler, GradScalerOptions, GradScalerState, Optimizer,
    ParamGroup,
};
use kiln_sched::log::ScalarLogger;
use kiln_sched::{CosineAnnealingLR, LinearLR, LrScheduler, SequentialLR};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// What can go wrong in the recipe: each crate's error, or a bad setting / checkpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// From kiln-device.
    #[error(transparent)]
    Device(#[from] kiln_device::Error),
    /// From kiln-autograd.
    #[error(transparent)]
    Autograd(#[from] kiln_autograd::Error),
    /// From kiln-losses.
    #[error(transparent)]
    Losses(#[from] kiln_losses::Error),
    /// From kiln-optim.
    #[error(transparent)]
    Optim(#[from] kiln_optim::Error),
    /// From kiln-sched (schedulers and logging).
    #[error(transparent)]
    Sched(#[from] kiln_sched::SchedError),
    /// From kiln-models.
    #[error(transparent)]
    Models(#[from] kiln_models::Error),
    /// From kiln-data.
    #[error(transparent)]
    Data(#[from] kiln_data::Error),
    /// A setting that cannot work, with the fix.
    #[error("invalid setting: {0}")]
    Config(String),
    /// A checkpoint that cannot be used, with the reason.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// A file in the run folder could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// The recipe's result type.
pub type Result<T> = std::result::Result<T, Error>;

/// Every knob of [`train`]; [`TrainConfig::default`] is the example's defaults.
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
    /// Width and depth of the network (channels, size and classes come from the data).
    pub width: usize,
    /// Blocks per stage.
    pub blocks: [usize; 4],
    /// Random crop and flip on the training set (the data source's default augmentation).
    pub augment: bool,
    /// Batches the loader's worker prepares ahead.
    pub prefetch_batches: usize,
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
            width: 16,
            blocks: [1, 1, 1, 1],
            augment: true,
            prefetch_batches: 2,
        }
    }
}

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

/// What [`train`] decided before the first step.
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
    /// Training / validation samples.
    pub samples: (usize, usize),
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

/// The checkpoint file of a run folder.
pub fn checkpoint_path(run_dir: &std::path::Path) -> PathBuf {
    run_dir.join("ckpt.safetensors")
}

fn is_head(name: &str) -> bool {
    name.starts_with("fc.")
}

fn check(config: &TrainConfig) -> Result<()> {
    let bad = |m: String| Err(Error::Config(m));
    if config.amp && !matches!(config.amp_dtype, DType::BF16 | DType::F16) {
        return bad(format!(
            "--amp-dtype {}: mixed precision autocasts to a 16-bit float; use bf16 or f16",
            config.amp_dtype
        ));
    }
    if config.epochs == 0 || config.accum_steps == 0 {
        return bad("epochs and accum-steps must be at least 1".into());
    }
    if !(config.lr > 0.0 && config.max_grad_norm > 0.0) {
        return bad("lr and max-grad-norm must be positive".into());
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

/// Runs the recipe (see the module docs).
pub fn train(config: &TrainConfig, observer: &mut dyn Observer) -> Result<Outcome> {
    check(config)?;
    let device = config.device;
    let io = |path: PathBuf| move |source| Error::Io { path, source };
    std::fs::create_dir_all(&config.run_dir).map_err(io(config.run_dir.clone()))?;
    let ckpt_path = checkpoint_path(&config.run_dir);
    let resuming = config.resume && ckpt_path.exists();

    // Data and model.
    let (train_set, val_set) = config.data.load(config.seed)?;
    let [c, h, w] = train_set.sample_shape();
    let info = ModelInfo {
        config: ModelConfig {
            in_channels: c,
            image_size: [h, w],
            num_classes: train_set.num_classes(),
            width: config.width,
            blocks: config.blocks,
        },
        classes: train_set.classes().to_vec(),
        normalize: config.data.normalize(&train_set)?,
    };
    kiln_autograd::manual_seed(config.seed);
    let mut model = info.config.build()?;
    let resumed = if resuming {
        Some(checkpoint::resume(&model, &ckpt_path)?)
    } else {
        None
    };
    // Layers are built on the CPU; move them before the optimizer exists, so its state (and a
    // resumed one) is created on the device.
    model.to_device(device)?;

    // Summary, memory plan and the batch size.
    let summary = kiln_models::summary(&model, &[1, c, h, w])?.to_string();
    let plan = kiln_models::plan(&model, &[c, h, w], DType::F32, OptimizerKind::AdamW)?;
    let (batch_size, budget, plan_max) = match (&resumed, config.batch_size) {
        (Some(r), _) => (r.progress.batch_size, None, None),
        (None, Some(b)) => (b, None, None),
        (None, None) => {
            // Plan against half of what the device has free: the rest is for the data, the
            // validation pass and whatever else runs on the machine.
            let budget = (device.memory_info()?.free / 2) as usize;
            let max = plan.max_batch_size(budget)?;
            (max.min(config.max_auto_batch), Some(budget), Some(max))
        }
    };
    if batch_size == 0 {
        return Err(Error::Config("batch size 0; pass at least 1".into()));
    }
    let augment = if config.augment {
        config.data.augment()
    } else {
        Default::default()
    };
    let mut train_loader = DataLoader::new(
        Arc::new(train_set),
        DataLoaderConfig {
            batch_size,
            shuffle: true,
            drop_last: true,
            seed: config.seed,
            prefetch_batches: config.prefetch_batches,
            augment,
            normalize: Some(info.normalize.clone()),
        },
        device,
    )?;
    let mut val_loader = DataLoader::new(
        Arc::new(val_set),
        DataLoaderConfig {
            batch_size: batch_size.max(256),
            normalize: Some(info.normalize.clone()),
            ..Default::default()
        },
        device,
    )?;
    let batches = train_loader.len();
    let steps_per_epoch = batches.div_ceil(config.accum_steps);
    let total_steps = steps_per_epoch * config.epochs;

    // Two parameter groups from the start: backbone (small lr) and head (large lr), one weight
    // decay. While the backbone is frozen its parameters get no gradient, so AdamW skips them
    // and keeps no state for them; unfreezing is then only `unfreeze`, and the optimizer and the
    // warm-up + cosine schedule (which is tied to the number of groups) run on unchanged. The
    // alternative, `add_param_group` at the unfreeze, would need a new scheduler mid-run.
    let (head, backbone): (Vec<_>, Vec<_>) = model
        .named_parameters()
        .into_iter()
        .partition(|(n, _)| is_head(n));
    let mut opt = AdamW::new(
        vec![
            ParamGroup::new(backbone).lr(config.lr * config.backbone_lr_factor),
            ParamGroup::new(head).lr(config.lr),
        ],
        AdamOptions::adamw().weight_decay(config.weight_decay),
    )?;
    let warmup_steps = ((total_steps as f64 * config.warmup_fraction) as usize).max(1);
    let warmup = LinearLR::new(&mut opt, 0.1, 1.0, warmup_steps)?;
    let cosine = CosineAnnealingLR::new(&mut opt, total_steps.saturating_sub(warmup_steps), 0.0)?;
    let mut sched = SequentialLR::new(
        &mut opt,
        vec![Box::new(warmup), Box::new(cosine)],
        &[warmup_steps],
    )?;
    let mut progress = Progress {
        epochs_done: 0,
        global_step: 0,
        batch_size,
        seed: config.seed,
        history: Vec::new(),
    };
    let mut resumed_scaler = None;
    if let Some(r) = resumed {
        opt.load_state_dict(&r.optimizer)?;
        sched.load_state_dict(&r.scheduler)?;
        train_loader.set_state(r.loader)?;
        progress = r.progress;
        resumed_scaler = r.grad_scaler;
    }
    observer.setup(&Setup {
        summary,
        plan,
        budget_bytes: budget,
        batch_size,
        plan_max_batch: plan_max,
        batches_per_epoch: batches,
        resumed_epochs: progress.epochs_done,
        samples: (train_loader.dataset().len(), val_loader.dataset().len()),
    });

    let mut logger = ScalarLogger::in_memory()
        .tensorboard(config.run_dir.join("tensorboard"))?
        .csv(config.run_dir.join("metrics.csv"))?
        .flush_every(50);
    let mut batch_losses = Vec::new();
    let ce = CrossEntropyOptions::default();
    // f16 needs loss scaling (its range ends at 65504 and small gradients flush to zero); bf16
    // has f32's exponent range and needs none. A resumed run continues from the saved scale.
    let mut scaler = if config.amp && config.amp_dtype == DType::F16 {
        let mut s = GradScaler::new(config.grad_scaler)?;
        if let Some(state) = &resumed_scaler {
            s.load_state_dict(state)?;
        }
        Some(s)
    } else {
        None
    };
    let last = config
        .stop_after
        .unwrap_or(config.epochs)
        .min(config.epochs);
    for epoch in progress.epochs_done..last {
        let start = Instant::now();
        kiln_device::reset_peak_memory_stats(device)?;
        let frozen = epoch < config.freeze_epochs;
        if frozen {
            model.freeze(|n| !is_head(n))?;
        } else {
            model.unfreeze(|_| true)?;
        }
        model.train(true);
        observer.epoch_start(epoch + 1, batches);
        let (mut loss_sum, mut norm_sum, mut norms, mut seen) = (0.0, 0.0, 0usize, 0usize);
        for (i, batch) in train_loader.iter().enumerate() {
            let batch = batch?;
            // Each batch's loss is divided by the number of batches in its accumulation group
            // (the last group of an epoch may be shorter), so a step sees the group's mean.
            let group_start = i - i % config.accum_steps;
            let group_len = config.accum_steps.min(batches - group_start);
            let loss = {
                let _autocast = match config.amp {
                    true => Some(AutocastGuard::new(config.amp_dtype)?),
                    false => None,
                };
                let logits = model.forward(&batch.images)?;
                cross_entropy(&logits, &batch.labels, &ce)?
            };
            let share = loss.div_scalar(group_len as f64)?;
            match &scaler {
                Some(s) => s.scale(&share)?.backward()?,
                None => share.backward()?,
            }
            let value = loss.item()?;
            let n = batch.labels.shape()[0];
            loss_sum += value;
            seen += n;
            batch_losses.push(value);
            observer.batch(n, value);
            if i + 1 == group_start + group_len {
                let norm = match &mut scaler {
                    Some(s) => {
                        // Clip the true gradients; a step whose gradients overflowed is
                        // skipped by the scaler (and the scale backs off), so the norm may be
                        // inf here without failing the run.
                        s.unscale_(&mut opt)?;
                        let norm =
                            clip_grad_norm_(&opt.named_params(), config.max_grad_norm, 2.0, false)?;
                        s.step(&mut opt)?;
                        s.update()?;
                        norm
                    }
                    None => {
                        let norm =
                            clip_grad_norm_(&opt.named_params(), config.max_grad_norm, 2.0, true)?;
                        opt.step()?;
                        norm
                    }
                };
                opt.zero_grad(true)?;
                sched.step(&mut opt)?;
                progress.global_step += 1;
                norm_sum += norm;
                norms += 1;
                logger.log_many(
                    progress.global_step as i64,
                    &[
                        ("train/loss", value),
                        ("train/grad_norm", norm),
                        ("lr/backbone", opt.lr(0)?),
                        ("lr/head", opt.lr(1)?),
                    ],
                )?;
            }
        }
        let train_seconds = start.elapsed().as_secs_f64();
        let (val_loss, val_accuracy) = evaluate(&mut model, &mut val_loader)?;
        kiln_device::empty_cache(device)?;
        let report = EpochReport {
            epoch: epoch + 1,
            frozen,
            train_loss: loss_sum / batches as f64,
            val_loss,
            val_accuracy,
            lr: [opt.lr(0)?, opt.lr(1)?],
            grad_norm: norm_sum / norms.max(1) as f64,
            memory: [
                kiln_device::memory_allocated(device)?,
                kiln_device::memory_reserved(device)?,
                kiln_device::max_memory_allocated(device)?,
            ],
            samples_per_sec: seen as f64 / train_seconds,
            seconds: start.elapsed().as_secs_f64(),
        };
        logger.log_many(
            progress.global_step as i64,
            &[
                ("val/loss", val_loss),
                ("val/accuracy", val_accuracy),
                ("epoch/train_loss", report.train_loss),
            ],
        )?;
        logger.flush()?;
        progress.epochs_done = epoch + 1;
        progress.history.push(report.clone());
        let sched_state = sched.state_dict();
        checkpoint::save(
            &model,
            &Saved {
                info: &info,
                optimizer: &opt.state_dict()?,
                scheduler: &sched_state,
                loader: train_loader.state(),
                progress: &progress,
                grad_scaler: scaler.as_ref().map(GradScaler::state_dict),
            },
            &ckpt_path,
        )?;
        write_plot(config, &progress.history)?;
        observer.epoch_end(&report);
    }
    Ok(Outcome {
        history: progress.history,
        batch_losses,
        model,
        checkpoint: ckpt_path,
        grad_scaler: scaler.as_ref().map(GradScaler::state_dict),
    })
}

/// Mean loss and accuracy over `loader`, under `no_grad` in eval mode (BatchNorm uses its
/// running statistics); the model is back in training mode afterwards.
pub fn evaluate(model: &mut ResNet, loader: &mut DataLoader) -> Result<(f64, f64)> {
    model.eval();
    let ce = CrossEntropyOptions::default();
    let result = no_grad(|| -> Result<(f64, f64)> {
        let (mut loss, mut correct, mut n) = (0.0, 0usize, 0usize);
        for batch in loader.iter() {
            let batch = batch?;
            let logits = model.forward(&batch.images)?;
            let b = batch.labels.shape()[0];
            loss += cross_entropy(&logits, &batch.labels, &ce)?.item()? * b as f64;
            let predicted = logits.argmax(1, false)?.to_vec::<i64>()?;
            let labels = batch.labels.to_vec::<i64>()?;
            correct += predicted
                .iter()
                .zip(&labels)
                .filter(|(p, l)| p == l)
                .count();
            n += b;
        }
        Ok((loss / n as f64, correct as f64 / n as f64))
    });
    model.train(true);
    result
}

/// The SVG plot of the run so far: validation accuracy, losses and the head's lr per epoch.
fn write_plot(config: &TrainConfig, history: &[EpochReport]) -> Result<()> {
    use kiln_sched::log::svg::{Figure, Plot};
    let series = |f: &dyn Fn(&EpochReport) -> f64| -> Vec<(f64, f64)> {
        history.iter().map(|r| (r.epoch as f64, f(r))).collect()
    };
    let mut fig = Figure::new("kiln training run");
    fig.push(
        Plot::new("loss")
            .x_label("epoch")
            .series("train", series(&|r| r.train_loss))
            .series("validation", series(&|r| r.val_loss)),
    );
    fig.push(
        Plot::new("validation accuracy")
            .x_label("epoch")
            .series("accuracy", series(&|r| r.val_accuracy)),
    );
    fig.push(
        Plot::new("learning rate (end of epoch)")
            .x_label("epoch")
            .series("backbone", series(&|r| r.lr[0]))
            .series("head", series(&|r| r.lr[1])),
    );
    Ok(fig.write(config.run_dir.join("metrics.svg"))?)
}
