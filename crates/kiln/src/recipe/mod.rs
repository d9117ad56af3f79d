//! The training recipe behind `cargo run --example train`, as a library so tests and other
//! programs can run it: [`train`] takes a [`TrainConfig`] and a [`Observer`] (the example's
//! progress bar) and runs every practice of the guide in one loop:
//!
//! - a `ResNet` (CIFAR stem, or one of torchvision's with `model`) sized by [`ModelConfig`], its
//!   summary and training memory plan, and the batch size the plan allows on the device (capped);
//! - fine-tuning: with `pretrained`, a torchvision state dict (`.pth` or `.safetensors`) loaded
//!   into the backbone, every key checked, its head replaced by a new one for the data's classes;
//! - the backbone frozen for the first `freeze_epochs` epochs, then trained with its own, smaller
//!   learning rate (two AdamW parameter groups, shared weight decay);
//! - gradient accumulation over `accum_steps` batches, clipping by global norm (the norm is
//!   logged), a linear warm-up then cosine decay (`SequentialLR`) stepped per optimizer step;
//! - validation under `no_grad` in eval mode after each epoch, then `empty_cache()`;
//! - TensorBoard events, a CSV and an SVG plot in the run folder, and a checkpoint after every
//!   epoch ([`checkpoint`]) from which `resume` continues bit for bit;
//! - `memory.svg`: one step's memory stacked by category and the per-epoch curves, and with
//!   `memory_history` the allocation history as `memory_snapshot.pickle` ([`memory`]);
//! - the model moved to the chosen device once, before the optimizer is built (so its state is
//!   created there too), and batches delivered there by the loader;
//! - optional mixed precision: forward and loss under `autocast` (bf16 by default; matmuls and
//!   convolutions in 16 bits, softmax, norms and reductions in f32) while parameters, gradients,
//!   optimizer state and checkpoints stay f32; with f16 a `GradScaler` scales the loss, unscales
//!   before clipping and skips steps whose gradients overflowed. bf16 has f32's range and needs
//!   no scaling. It runs on the CPU too (slowly: the CPU kernels compute in f32 after casting).
//! - optional data parallelism (`distributed`): one process per device, the
//!   model wrapped in `DistributedDataParallel`, the training set sharded, rank 0 alone writing.

mod build;
pub mod checkpoint;
mod config;
mod distributed;
mod epoch;
mod error;
pub mod memory;
pub mod model;
mod predict;
mod report;
mod resume;

pub use checkpoint::checkpoint_path;
pub use config::{Distributed, TrainConfig};
pub use epoch::evaluate;
pub use error::{Error, Result};
pub use model::{Arch, ModelConfig, PretrainedReport};
pub use predict::{predict, top_k};
pub use report::{EpochReport, Observer, Outcome, Quiet, Setup};
pub use resume::{take_checkpoint_settings, GivenSettings};

use kiln_optim::GradScaler;
use std::path::PathBuf;

/// Runs the recipe (see the module docs).
pub fn train(config: &TrainConfig, observer: &mut dyn Observer) -> error::Result<Outcome> {
    config::check(config)?;
    let io = |path: PathBuf| move |source| error::Error::Io { path, source };
    if config.run_dir.exists() && !config.run_dir.is_dir() {
        return Err(error::Error::Config(format!(
            "--run-dir {} is a file, not a folder; pass a folder (it is created if missing)",
            config.run_dir.display()
        )));
    }
    let ckpt_path = checkpoint_path(&config.run_dir);
    if config.is_writer() {
        std::fs::create_dir_all(&config.run_dir).map_err(io(config.run_dir.clone()))?;
        // Temporary files of checkpoint writes that were killed would otherwise stay forever.
        kiln_models::checkpoint::remove_stale_temp_files(&ckpt_path)?;
    }
    let resuming = distributed::agree_on_resume(config, config.resume && ckpt_path.exists())?;
    let mut trainer = build::trainer(config, &ckpt_path, resuming, observer)?;
    let last = config
        .stop_after
        .unwrap_or(config.epochs)
        .min(config.epochs);
    for epoch in trainer.progress.epochs_done..last {
        trainer.run_epoch(config, epoch, &ckpt_path, observer)?;
    }
    Ok(Outcome {
        history: trainer.progress.history,
        batch_losses: trainer.batch_losses,
        model: trainer.model,
        checkpoint: ckpt_path,
        grad_scaler: trainer.steps.scaler.as_ref().map(GradScaler::state_dict),
    })
}
