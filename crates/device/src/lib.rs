//! `kiln-device`: devices (CPU and CUDA), visibility, properties and kernel loading.

mod backend;
mod device;
mod dtype;
mod error;
mod layout;
mod nvrtc_options;
pub mod ops;
mod storage;
pub mod threads;

pub use backend::{BackendStorage, BinaryOp, CmpOp, ReduceOp, UnaryOp};
pub use device::Device;
pub use dtype::{BoolByte, DType, Element};
pub use error::{Error, Result};
pub use layout::{contiguous_strides, Layout, StridedIndex};
pub use nvrtc_options::nvrtc_options;
#[cfg(feature = "cuda")]
pub use storage::{cuda_stream, CudaStorage};
pub use storage::{CpuStorage, HostBuffer, Storage};
