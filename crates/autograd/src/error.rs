//! Errors of `kiln-autograd`. Every message names the op, what was wrong, and how to fix it.

/// Everything that can go wrong in `kiln-autograd`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Shapes that break an op's rule, e.g. `matmul: [32, 784] @ [512, 256]: inner dims 784 != 512`.
    #[error("{op}: {msg}")]
    Shape {
        /// The op.
        op: &'static str,
        /// The shapes and the rule they break.
        msg: String,
    },
    /// An argument out of range or of the wrong kind (a dim, an index, a size).
    #[error("{op}: {msg}")]
    InvalidArgument {
        /// The op.
        op: &'static str,
        /// What was wrong and what to pass instead.
        msg: String,
    },
    /// A dtype the op cannot take, or operands of different dtypes.
    #[error("{op}: {msg}")]
    DType {
        /// The op.
        op: &'static str,
        /// The dtypes and the fix.
        msg: String,
    },
    /// Misuse of the autograd graph (backward twice, backward on a non-scalar, ...).
    #[error("{0}")]
    Autograd(String),
    /// An error from the device layer (kernel missing on a device, CUDA failure, ...).
    #[error(transparent)]
    Device(#[from] kiln_device::Error),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn shape_err(op: &'static str, msg: impl Into<String>) -> Error {
    Error::Shape {
        op,
        msg: msg.into(),
    }
}

pub(crate) fn arg_err(op: &'static str, msg: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op,
        msg: msg.into(),
    }
}

pub(crate) fn dtype_err(op: &'static str, msg: impl Into<String>) -> Error {
    Error::DType {
        op,
        msg: msg.into(),
    }
}
