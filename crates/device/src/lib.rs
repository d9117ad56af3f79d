//! `kiln-device`: devices (CPU and CUDA), visibility, properties, storage, the backend seam every
//! op goes through, and the kernels (CPU here; CUDA C beside them).

mod backend;
#[cfg(feature = "cuda")]
pub mod cuda;
mod device;
mod dtype;
mod error;
mod layout;
mod memory;
mod nvrtc_options;
pub mod ops;
mod properties;
mod status;
mod storage;
mod sync;
pub mod testing;
pub mod threads;
pub mod visibility;

pub use backend::{BackendStorage, BinaryOp, CmpOp, ReduceOp, UnaryOp};
pub use backend::{BatchNormStats, GradMask, Grads3, Pool2d, RunningStatsMut, Strided};
pub use device::{Device, DeviceChoice};
pub use dtype::{BoolByte, DType, Element};
pub use error::{Error, Result};
pub use layout::{contiguous_strides, Layout, StridedIndex};
pub use memory::{
    allocator, empty_cache, max_memory_allocated, max_memory_reserved, memory_allocated,
    memory_reserved, memory_snapshot, memory_stats, memory_summary, reset_peak_memory_stats,
};
pub use nvrtc_options::nvrtc_options;
pub use properties::{
    format_bytes, format_uuid, CpuProperties, CudaDeviceProperties, DeviceProperties, MemoryInfo,
};
pub use status::{cuda_status, CudaStatus, CudaUnavailable};
#[cfg(feature = "cuda")]
pub use storage::{cuda_stream, CudaStorage};
pub use storage::{CpuStorage, HostBuffer, Storage};
pub use sync::{eager_checks, set_eager_checks, synchronize, EAGER_CHECKS_VAR};
pub use visibility::{set_visible_devices, VisibleDevices};
