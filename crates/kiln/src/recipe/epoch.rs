//! One epoch of the recipe: the backbone frozen or not, every batch's forward (under autocast
//! with `amp`) and backward with its share of the accumulation group's loss, an optimizer step
//! at the end of each group ([`Steps::step`]: unscale, clip, step, zero, schedule), then
//! validation, the epoch's report, the checkpoint and the plot.
//!
//! Invariants: the schedule advances once per optimizer step, never per batch; the checkpoint
//! is written after the epoch's state is complete, so a run stopped between epochs resumes
//! from exactly where it stopped. A data-parallel run averages the gradients of each
//! optimizer step over the ranks before clipping (so every rank clips by the same norm and
//! steps identically); only rank 0 writes the checkpoint and the plot.

use super::checkpoint::{self, ModelInfo, Progress, Saved};
use super::config::TrainConfig;
use super::distributed::Shared;
use super::error::Result;
use super::model::is_head;
use super::report::{EpochReport, Observer};
use kiln_autograd::{no_grad, AutocastGuard, Module, Tensor};
use kiln_data::DataLoader;
use kiln_distributed::DistributedDataParallel;
use kiln_losses::{cross_entropy, CrossEntropyOptions};
use kiln_models::models::ResNet;
use kiln_models::{Freeze, Layer};
use kiln_optim::{clip_grad_norm_, Adam, GradScaler, Optimizer};
use kiln_sched::log::ScalarLogger;
use kiln_sched::{LrScheduler, SequentialLR};
use std::path::Path;
use std::time::Instant;

/// What changes the parameters: the optimizer, its schedule and the f16 loss scaler.
pub(super) struct Steps {
    /// AdamW over (backbone, head).
    pub opt: Adam,
    /// Warm-up then cosine, stepped per optimizer step.
    pub sched: SequentialLR,
    /// Loss scaling of f16 `amp` runs.
    pub scaler: Option<GradScaler>,
}

impl Steps {
    /// One optimizer step on the accumulated gradients; returns the gradient norm before
    /// clipping.
    fn step(&mut self, max_grad_norm: f64) -> Result<f64> {
        let opt = &mut self.opt;
        let norm = match &mut self.scaler {
            Some(s) => {
                // Clip the true gradients; a step whose gradients overflowed is skipped by the
                // scaler (and the scale backs off), so the norm may be inf here without failing
                // the run.
                s.unscale_(opt)?;
                let norm = clip_grad_norm_(&opt.named_params(), max_grad_norm, 2.0, false)?;
                s.step(opt)?;
                s.update()?;
                norm
            }
            None => {
                let norm = clip_grad_norm_(&opt.named_params(), max_grad_norm, 2.0, true)?;
                opt.step()?;
                norm
            }
        };
        opt.zero_grad(true)?;
        self.sched.step(opt)?;
        Ok(norm)
    }
}

/// A run in progress: everything built by `build::trainer` and what it has done so far.
pub(super) struct Trainer {
    /// The network, on the run's device.
    pub model: ResNet,
    /// What the checkpoint stores about the model.
    pub info: ModelInfo,
    /// Shuffled, augmented training batches.
    pub train_loader: DataLoader,
    /// Validation batches.
    pub val_loader: DataLoader,
    /// Optimizer, schedule, scaler.
    pub steps: Steps,
    /// TensorBoard + CSV.
    pub logger: ScalarLogger,
    /// Epochs and steps done, and every epoch's report.
    pub progress: Progress,
    /// The loss of every batch this call trained.
    pub batch_losses: Vec<f64>,
    /// The recorded step and the run folder's memory files.
    pub memory: super::memory::MemoryPicture,
}

/// The mean cross-entropy of `images` against `labels` (under autocast with `amp`), its share
/// `1 / group_len` back-propagated (scaled by the f16 scaler if any); returns the mean. With
/// `ddp` the forward runs through it: a `sync` batch (the last of its accumulation group) has
/// its gradients averaged over the ranks, the others only accumulate locally (`no_sync`).
#[allow(clippy::too_many_arguments)]
fn forward_backward(
    model: &ResNet,
    ddp: Option<&DistributedDataParallel<Shared<'_>>>,
    images: &Tensor,
    labels: &Tensor,
    (group_len, sync): (usize, bool),
    scaler: Option<&GradScaler>,
    config: &TrainConfig,
) -> Result<f64> {
    let _no_sync = ddp.filter(|_| !sync).map(|d| d.no_sync());
    let ce = CrossEntropyOptions::default();
    let loss = {
        let _autocast = match config.amp {
            true => Some(AutocastGuard::new(config.amp_dtype)?),
            false => None,
        };
        let logits = match ddp {
            Some(d) => d.forward(images)?,
            None => model.forward(images)?,
        };
        cross_entropy(&logits, labels, &ce)?
    };
    let share = loss.div_scalar(group_len as f64)?;
    let backward = match scaler {
        Some(s) => s.scale(&share)?.backward(),
        None => share.backward(),
    };
    // A gradient hook's failure (a collective's, naming the rank) is the error `finish` gives.
    if let Some(d) = ddp {
        d.finish()?;
    }
    backward?;
    Ok(loss.item()?)
}

impl Trainer {
    /// Trains epoch `epoch` (from 0), validates, checkpoints to `ckpt_path` and plots.
    pub fn run_epoch(
        &mut self,
        config: &TrainConfig,
        epoch: usize,
        ckpt_path: &Path,
        observer: &mut dyn Observer,
    ) -> Result<EpochReport> {
        let device = config.device;
        let start = Instant::now();
        kiln_device::reset_peak_memory_stats(device)?;
        let frozen = epoch < config.freeze_epochs;
        if frozen {
            self.model.freeze(|n| !is_head(n))?;
        } else {
            self.model.unfreeze(|_| true)?;
        }
        self.model.train(true);
        if frozen && config.pretrained.is_some() {
            super::model::hold_backbone_statistics(&mut self.model);
        }
        let ddp = super::distributed::replicate(config, &self.model)?;
        let batches = self.train_loader.len();
        observer.epoch_start(epoch + 1, batches);
        let (mut loss_sum, mut norm_sum, mut norms, mut seen) = (0.0, 0.0, 0usize, 0usize);
        for (i, batch) in self.train_loader.iter().enumerate() {
            let batch = batch?;
            // Each batch's loss is divided by the number of batches in its accumulation group
            // (the last group of an epoch may be shorter), so a step sees the group's mean.
            let group_start = i - i % config.accum_steps;
            let group_len = config.accum_steps.min(batches - group_start);
            if i == group_start {
                // Planned steps (`planned_steps:True` in KILN_ALLOC_CONF) start here.
                kiln_device::mark_step(device)?;
            }
            self.memory.before_batch(config, epoch, i, batches)?;
            let sync = i + 1 == group_start + group_len;
            let value = forward_backward(
                &self.model,
                ddp.as_ref(),
                &batch.images,
                &batch.labels,
                (group_len, sync),
                self.steps.scaler.as_ref(),
                config,
            )?;
            let n = batch.labels.shape()[0];
            loss_sum += value;
            seen += n;
            self.batch_losses.push(value);
            observer.batch(n, value);
            if sync {
                let norm = self.steps.step(config.max_grad_norm)?;
                self.progress.global_step += 1;
                norm_sum += norm;
                norms += 1;
                let opt = &self.steps.opt;
                self.logger.log_many(
                    self.progress.global_step as i64,
                    &[
                        ("train/loss", value),
                        ("train/grad_norm", norm),
                        ("lr/backbone", opt.lr(0)?),
                        ("lr/head", opt.lr(1)?),
                    ],
                )?;
            }
            self.memory.after_batch(config, epoch, i)?;
        }
        drop(ddp);
        super::distributed::sync_buffers(config, &self.model)?;
        let train_seconds = start.elapsed().as_secs_f64();
        let train_loss = super::distributed::mean_over_ranks(config, loss_sum / batches as f64)?;
        let (val_loss, val_accuracy) = evaluate(&mut self.model, &mut self.val_loader)?;
        kiln_device::empty_cache(device)?;
        let opt = &self.steps.opt;
        let report = EpochReport {
            epoch: epoch + 1,
            frozen,
            train_loss,
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
        self.logger.log_many(
            self.progress.global_step as i64,
            &[
                ("val/loss", val_loss),
                ("val/accuracy", val_accuracy),
                ("epoch/train_loss", report.train_loss),
            ],
        )?;
        self.logger.flush()?;
        self.progress.epochs_done = epoch + 1;
        self.progress.history.push(report.clone());
        if config.is_writer() {
            self.save(ckpt_path)?;
            write_plot(config, &self.progress.history)?;
        }
        self.memory.write(config, &self.progress.history)?;
        observer.epoch_end(&report);
        Ok(report)
    }

    /// Writes the run's checkpoint (model, optimizer, schedule, loader, progress, scaler).
    fn save(&self, ckpt_path: &Path) -> Result<()> {
        let sched_state = self.steps.sched.state_dict();
        checkpoint::save(
            &self.model,
            &Saved {
                info: &self.info,
                optimizer: &self.steps.opt.state_dict()?,
                scheduler: &sched_state,
                loader: self.train_loader.state(),
                progress: &self.progress,
                grad_scaler: self.steps.scaler.as_ref().map(GradScaler::state_dict),
            },
            ckpt_path,
        )
    }
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
