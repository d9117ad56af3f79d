//! [`Storage`]: a buffer on some device, and the device buffers it holds.
//!
//! `Storage` is an enum over the device storages ([`CpuStorage`] always, [`CudaStorage`] with
//! the `cuda` feature). This folder holds buffers only: their memory, their element types and
//! the host/device copies of raw bytes. The ops on them are the op-family traits of
//! `crate::ops`, whose `Storage` implementations dispatch on the variant (`crate::seam`).

mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
mod host;

pub use cpu::CpuStorage;
pub(crate) use cpu::HostElement;
pub(crate) use cpu::{by_dtype, with_slice};
#[cfg(feature = "cuda")]
pub(crate) use cuda::ordinal_of as cuda_ordinal;
#[cfg(feature = "cuda")]
pub use cuda::{stream as cuda_stream, CudaStorage};
pub use host::HostBuffer;

/// A buffer of one dtype on one device.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Storage {
    /// Host memory.
    Cpu(CpuStorage),
    /// CUDA device memory.
    #[cfg(feature = "cuda")]
    Cuda(CudaStorage),
}

impl Storage {
    /// A host storage owning `data`.
    pub fn from_vec<T: crate::Element>(data: Vec<T>) -> Self {
        Storage::Cpu(CpuStorage::from_vec(data))
    }
}
