//! Errors of `kiln-losses`. Each message names the loss, what is wrong with the arguments and how
//! to fix it; the target-form errors say which form the loss wants and how to convert.

/// Everything that can go wrong in `kiln-losses`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The target has the wrong form for this loss: one-hot vectors or probabilities where class
    /// indices are expected, or class indices where an elementwise loss needs values shaped like
    /// the input. The message says which form the loss wants and how to convert.
    #[error("{op}: {msg}")]
    TargetForm {
        /// The loss.
        op: &'static str,
        /// What was given, what is wanted, how to convert.
        msg: String,
    },
    /// Input, target or weight shapes that do not fit together; the message names both shapes.
    #[error("{op}: {msg}")]
    Shape {
        /// The loss.
        op: &'static str,
        /// The shapes and the rule.
        msg: String,
    },
    /// A class-index target outside `[0, classes)` that is not `ignore_index`.
    #[error(
        "{op}: target {value} at position {position:?} is out of range for {classes} classes; class \
         indices must lie in [0, {classes}){ignore}; check the labels or the number of outputs of \
         the model"
    )]
    TargetOutOfRange {
        /// The loss.
        op: &'static str,
        /// The bad target value (the first in row-major order).
        value: i64,
        /// Its coordinates in the target tensor.
        position: Vec<usize>,
        /// The number of classes (size of the input's class dim).
        classes: usize,
        /// `", or equal ignore_index (-100)"`, or empty.
        ignore: String,
    },
    /// A label `one_hot` cannot encode: negative, or not below `num_classes`.
    #[error("one_hot: label {value} at position {position:?} {why}")]
    InvalidLabel {
        /// The label.
        value: i64,
        /// Its coordinates in the labels tensor.
        position: Vec<usize>,
        /// Why it is invalid and the fix.
        why: String,
    },
    /// An option or argument out of range (label smoothing, beta, input probabilities, ...).
    #[error("{op}: {msg}")]
    InvalidArgument {
        /// The loss.
        op: &'static str,
        /// What was wrong and what to pass instead.
        msg: String,
    },
    /// A dtype the loss cannot take.
    #[error("{op}: {msg}")]
    DType {
        /// The loss.
        op: &'static str,
        /// The dtypes and the fix.
        msg: String,
    },
    /// An error from a tensor op.
    #[error(transparent)]
    Tensor(#[from] kiln_autograd::Error),
}

impl From<kiln_device::Error> for Error {
    fn from(e: kiln_device::Error) -> Self {
        Error::Tensor(kiln_autograd::Error::Device(e))
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn shape_err(op: &'static str, msg: impl Into<String>) -> Error {
    Error::Shape {
        op,
        msg: msg.into(),
    }
}

pub(crate) fn form_err(op: &'static str, msg: impl Into<String>) -> Error {
    Error::TargetForm {
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
