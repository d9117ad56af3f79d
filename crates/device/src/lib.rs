//! `kiln-device`: devices (CPU and CUDA), visibility, properties and kernel loading.

mod device;
mod error;

pub use device::Device;
pub use error::{Error, Result};
