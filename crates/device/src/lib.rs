//! `kiln-device`: devices (CPU and CUDA), visibility, properties and kernel loading.

mod device;
mod error;
mod nvrtc_options;
pub mod ops;

pub use device::Device;
pub use error::{Error, Result};
pub use nvrtc_options::nvrtc_options;
