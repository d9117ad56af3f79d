//! Errors of `kiln-models`. Every message names what was wrong and how to fix it.

/// Everything that can go wrong in `kiln-models`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A tensor op failed (shape, dtype, device, autograd misuse).
    #[error(transparent)]
    Tensor(#[from] kiln_autograd::Error),
    /// A layer got an input of the wrong shape or kind, e.g.
    /// `Conv2d: expected a [N, 3, H, W] input, got [8, 1, 28, 28]`.
    #[error("{layer}: {msg}")]
    Input {
        /// The layer type (`Conv2d`, `Linear`, ...).
        layer: &'static str,
        /// What was wrong and what to pass instead.
        msg: String,
    },
    /// A layer or model configuration that cannot work (zero channels, heads not dividing the
    /// embedding width, an unknown model name, ...).
    #[error("{what}: {msg}")]
    Config {
        /// What was being built.
        what: &'static str,
        /// The problem and the fix.
        msg: String,
    },
    /// A checkpoint that does not fit the model: the keys are listed by name.
    #[error("load_safetensors: {0}")]
    StateDict(String),
    /// Reading or writing a checkpoint file failed.
    #[error("{path}: {msg}")]
    Io {
        /// The file.
        path: String,
        /// The OS error or the format problem.
        msg: String,
    },
    /// A PyTorch checkpoint file (`.pth`) that cannot be read: the format problem is typed.
    #[error("{path}: {source}")]
    Pth {
        /// The file.
        path: String,
        /// What is wrong with it.
        source: crate::pth::error::PthError,
    },
    /// A memory budget that cannot hold even the fixed part of training.
    #[error("memory plan: {0}")]
    Memory(String),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn input_err(layer: &'static str, msg: impl Into<String>) -> Error {
    Error::Input {
        layer,
        msg: msg.into(),
    }
}

pub(crate) fn config_err(what: &'static str, msg: impl Into<String>) -> Error {
    Error::Config {
        what,
        msg: msg.into(),
    }
}
