//! kiln's CUDA state: one primary context per visible device, opened on first use, and the
//! NVRTC kernel loader ([`kernels`]).
//!
//! Contexts are looked up by *logical* ordinal (`Device::Cuda(i)`) and opened on the driver
//! ordinal the visibility map gives for it ([`crate::visibility`]). Everything here first checks
//! [`crate::cuda_status`], so no driver call is made when the library is absent.

mod alloc_backend;
pub(crate) mod deferred;
pub mod headers;
pub mod kernel_cache;
pub mod kernels;
pub mod launch;
mod page_table;
pub(crate) mod probe;
pub mod source_override;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub use alloc_backend::CudaBackend;
pub use cudarc;
use cudarc::driver::{CudaContext, CudaStream, DriverError};
pub use deferred::{deferred_check_stats, DeferredCheckStats};

use crate::error::{Error, Result};
use crate::properties::{CudaDeviceProperties, MemoryInfo};
use crate::Device;

/// Turns a cudarc driver error into [`Error::Driver`], naming the call.
pub(crate) fn driver_error(call: &'static str, err: DriverError) -> Error {
    let detail = err
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    Error::Driver {
        call,
        code: format!("{} ({detail})", probe::code_name(&err)),
    }
}

/// The properties of a usable CUDA device, or why there is none.
pub(crate) fn device_properties(device: Device) -> Result<&'static CudaDeviceProperties> {
    let status = crate::cuda_status();
    status.check()?;
    let ordinal = match device {
        Device::Cuda(i) => i,
        Device::Cpu => {
            return Err(Error::CudaUnavailable(
                "cpu is not a CUDA device; pass Device::Cuda(i)".into(),
            ))
        }
    };
    let count = status.device_count();
    status
        .devices()
        .get(ordinal)
        .ok_or(Error::NoSuchCudaDevice { ordinal, count })
}

/// The primary context of `device` (a `Device::Cuda`), retained on first use and kept for the
/// life of the process.
pub fn context(device: Device) -> Result<Arc<CudaContext>> {
    static CONTEXTS: Mutex<Option<HashMap<usize, Arc<CudaContext>>>> = Mutex::new(None);
    let props = device_properties(device)?;
    let mut contexts = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
    let contexts = contexts.get_or_insert_with(HashMap::new);
    if let Some(ctx) = contexts.get(&props.logical) {
        return Ok(ctx.clone());
    }
    let ctx = CudaContext::new(props.driver_ordinal)
        .map_err(|e| driver_error("cuDevicePrimaryCtxRetain", e))?;
    contexts.insert(props.logical, ctx.clone());
    Ok(ctx)
}

/// The default stream of `device`'s context.
pub fn default_stream(device: Device) -> Result<Arc<CudaStream>> {
    Ok(context(device)?.default_stream())
}

/// Free and total memory of `device` (`cuMemGetInfo`, in its context).
pub(crate) fn memory_info(device: Device) -> Result<MemoryInfo> {
    let (free, total) = context(device)?
        .mem_get_info()
        .map_err(|e| driver_error("cuMemGetInfo", e))?;
    Ok(MemoryInfo {
        free: free as u64,
        total: total as u64,
    })
}
