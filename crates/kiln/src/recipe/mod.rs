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

mod build;
pub mod checkpoint;
mod config;
mod epoch;
pub mod model;
mod predict;
mod report;
mod resume;

pub use config::TrainConfig;
pub use epoch::evaluate;
pub use model::ModelConfig;
pub use predict::{predict, top_k};
pub use report::{EpochReport, Observer, Outcome, Quiet, Setup};

use config::check;
use kiln_optim::GradScaler;
use std::path::PathBuf;

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

/// The checkpoint file of a run folder.
pub fn checkpoint_path(run_dir: &std::path::Path) -> PathBuf {
    run_dir.join("ckpt.safetensors")
}

fn is_head(name: &str) -> bool {
    name.starts_with("fc.")
}

/// Runs the recipe (see the module docs).
pub fn train(config: &TrainConfig, observer: &mut dyn Observer) -> Result<Outcome> {
    check(config)?;
    let io = |path: PathBuf| move |source| Error::Io { path, source };
    std::fs::create_dir_all(&config.run_dir).map_err(io(config.run_dir.clone()))?;
    let ckpt_path = checkpoint_path(&config.run_dir);
    let resuming = config.resume && ckpt_path.exists();
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
