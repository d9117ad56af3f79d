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
mod seam;
mod status;
mod storage;
mod sync;
pub mod testing;
pub mod threads;
pub mod visibility;

pub use backend::BackendStorage;
pub use device::{Device, DeviceChoice};
pub use dtype::{BoolByte, DType, Element};
pub use error::{Error, Result};
pub use kiln_alloc_cache::{
    AllocContext, Attribution, CategoryBytes, ContextGuard, LiveBlock, MemoryCategory, MemoryEvent,
    MemoryEventKind, MemoryHistory, PlanPrediction,
};
pub use layout::{
    checked_numel, checked_shape_numel, checked_size, contiguous_strides, Layout, StridedIndex,
};
pub use memory::dump_snapshot;
pub use memory::{
    allocator, empty_cache, mark_step, max_memory_allocated, max_memory_reserved, memory_allocated,
    memory_history, memory_reserved, memory_snapshot, memory_stats, memory_summary,
    reattribute_storage, record_memory_history, reset_peak_memory_stats, set_memory_plan,
};
pub use nvrtc_options::nvrtc_options;
pub use ops::buffer::BufferOps;
pub use ops::conv::ConvOps;
pub use ops::copy::CopyOps;
pub use ops::elementwise::{BinaryOp, CmpOp, ElementwiseOps, UnaryOp};
pub use ops::fill::FillOps;
pub use ops::index::IndexOps;
pub use ops::loss::LossOps;
pub use ops::matmul::MatmulOps;
pub use ops::norm::{BatchNormStats, NormOps, RunningStatsMut};
pub use ops::pool::{Pool2d, PoolOps};
pub use ops::random::RandomOps;
pub use ops::reduce::{ReduceOp, ReduceOps};
pub use ops::softmax::SoftmaxOps;
pub use ops::topk::TopkOps;
pub use properties::{
    format_bytes, format_uuid, CpuProperties, CudaDeviceProperties, DeviceProperties, MemoryInfo,
};
pub use seam::{GradMask, InputGrads, Strided};
pub use status::{cuda_status, CudaStatus, CudaUnavailable};
#[cfg(feature = "cuda")]
pub use storage::{cuda_stream, CudaStorage};
pub use storage::{CpuStorage, HostBuffer, Storage};
pub use sync::{eager_checks, set_eager_checks, synchronize, wait_idle, EAGER_CHECKS_VAR};
pub use visibility::{set_visible_devices, VisibleDevices};

/// Every trait of the backend seam, for method syntax on storages: `use kiln_device::prelude::*`.
pub mod prelude {
    pub use crate::backend::BackendStorage;
    pub use crate::ops::buffer::BufferOps;
    pub use crate::ops::conv::ConvOps;
    pub use crate::ops::copy::CopyOps;
    pub use crate::ops::elementwise::ElementwiseOps;
    pub use crate::ops::fill::FillOps;
    pub use crate::ops::index::IndexOps;
    pub use crate::ops::loss::LossOps;
    pub use crate::ops::matmul::MatmulOps;
    pub use crate::ops::norm::NormOps;
    pub use crate::ops::pool::PoolOps;
    pub use crate::ops::random::RandomOps;
    pub use crate::ops::reduce::ReduceOps;
    pub use crate::ops::softmax::SoftmaxOps;
    pub use crate::ops::topk::TopkOps;
}
