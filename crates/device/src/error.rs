//! Errors of `kiln-device`.

/// Everything that can go wrong in `kiln-device`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A CUDA device was asked for but CUDA cannot be used; the string says why.
    #[error("CUDA unavailable: {0}")]
    CudaUnavailable(String),
    /// A kernel was called with bad parameters, shapes, buffers or indices.
    #[error(transparent)]
    Kernel(#[from] crate::ops::KernelError),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
