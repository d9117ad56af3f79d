//! The recipe's one error type: each crate's error it calls into, or a bad setting, checkpoint
//! or run-folder file, each with what to change.

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
    /// From kiln-distributed (a collective failed or timed out, naming the rank).
    #[error(transparent)]
    Distributed(#[from] kiln_distributed::Error),
    /// A setting that cannot work, with the fix.
    #[error("invalid setting: {0}")]
    Config(String),
    /// Pretrained weights that do not fit the chosen model, with the keys that did not match.
    #[error("pretrained weights: {0}")]
    Pretrained(String),
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
