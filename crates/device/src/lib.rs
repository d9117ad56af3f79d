//! `kiln-device`: devices (CPU and CUDA), visibility, properties and kernel loading.

#[cfg(feature = "cuda")]
pub mod cuda;
mod device;
mod error;
mod nvrtc_options;
pub mod ops;
mod properties;
mod status;
pub mod testing;
pub mod visibility;

pub use device::{Device, DeviceChoice};
pub use error::{Error, Result};
pub use nvrtc_options::nvrtc_options;
pub use properties::{
    format_bytes, format_uuid, CpuProperties, CudaDeviceProperties, DeviceProperties, MemoryInfo,
};
pub use status::{cuda_status, CudaStatus, CudaUnavailable};
pub use visibility::{set_visible_devices, VisibleDevices};
