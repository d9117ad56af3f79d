//! Errors of `kiln-optim`. Every message names the problem and the fix.

/// Everything that can go wrong in `kiln-optim`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A bad option value or argument (negative lr, betas outside [0, 1), NaN norm type, ...).
    #[error("{op}: {msg}")]
    InvalidArgument {
        /// The function or optimizer.
        op: &'static str,
        /// What was wrong and what to pass instead.
        msg: String,
    },
    /// A parameter group that cannot be used (empty, or a parameter listed twice).
    #[error("{0}")]
    ParamGroup(String),
    /// A non-finite total gradient norm with `error_if_nonfinite = true`.
    #[error(
        "clip_grad_norm_: the total norm of order {norm_type:?} of the gradients is non-finite \
         ({total}); the first parameter with a non-finite gradient norm is `{name}`. Fix the \
         cause (learning rate, loss scaling, bad input), or pass error_if_nonfinite = false to \
         scale by the non-finite norm anyway as PyTorch does"
    )]
    NonFiniteNorm {
        /// The norm type.
        norm_type: f64,
        /// The total norm (NaN or infinite).
        total: f64,
        /// Name of the first parameter whose gradient norm is non-finite.
        name: String,
    },
    /// A state dict that does not fit this optimizer.
    #[error("load_state_dict: {0}")]
    StateDict(String),
    /// A tensor dtype or device this path does not handle.
    #[error("{op}: {msg}")]
    Unsupported {
        /// The function.
        op: &'static str,
        /// What is unsupported and what to do instead.
        msg: String,
    },
    /// An error from the tensor layer.
    #[error(transparent)]
    Autograd(#[from] kiln_autograd::Error),
    /// An error from the device layer.
    #[error(transparent)]
    Device(#[from] kiln_device::Error),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn arg_err(op: &'static str, msg: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op,
        msg: msg.into(),
    }
}
