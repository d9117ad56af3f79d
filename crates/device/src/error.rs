//! Errors of `kiln-device`.

use crate::{DType, Device};

/// Everything that can go wrong in `kiln-device`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A CUDA device was asked for but CUDA cannot be used; the string says why.
    #[error("CUDA unavailable: {0}")]
    CudaUnavailable(String),
    /// An op was given a dtype its kernel does not support.
    #[error("{op}: dtype {dtype} is not supported; {hint}")]
    UnsupportedDType {
        /// The op.
        op: &'static str,
        /// The dtype it got.
        dtype: DType,
        /// What to do instead.
        hint: &'static str,
    },
    /// Two operands of one op have different dtypes.
    #[error("{op}: dtypes differ ({lhs} vs {rhs}); convert one with to_dtype first")]
    DTypeMismatch {
        /// The op.
        op: &'static str,
        /// First operand's dtype.
        lhs: DType,
        /// Second operand's dtype.
        rhs: DType,
    },
    /// Two operands of one op live on different devices.
    #[error(
        "{op}: operands are on different devices ({lhs} vs {rhs}); move one with to_device first"
    )]
    DeviceMismatch {
        /// The op.
        op: &'static str,
        /// First operand's device.
        lhs: Device,
        /// Second operand's device.
        rhs: Device,
    },
    /// The op has no kernel on this device yet.
    #[error("{op}: not implemented on {device} yet; move the tensors to the CPU with to_device(Device::Cpu)")]
    NotImplemented {
        /// The op.
        op: &'static str,
        /// The device.
        device: Device,
    },
    /// A CUDA driver call failed.
    #[error("CUDA error in {op}: {msg}")]
    Cuda {
        /// What was being done.
        op: &'static str,
        /// The driver's message.
        msg: String,
    },
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
