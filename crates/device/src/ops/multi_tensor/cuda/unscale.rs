//! Launcher of `kiln_mt_unscale`: AMP's unscale fused with the non-finite check. One launch
//! multiplies every gradient in the list by `1 / scale` in place and stores 1 into a
//! device-side [`FoundInfFlag`] when any element was NaN or infinite before scaling. Nothing
//! returns to the host until [`FoundInfFlag::read`] (one 4-byte copy, as PyTorch's
//! `GradScaler.step` does with `found_inf.item()`).

use cudarc::driver::{CudaSlice, CudaStream, PushKernelArg};
use std::sync::Arc;

use super::MULTI_TENSOR_KERNELS;
use super::{chunk_launch_config, chunk_table, dtype_code, DeviceTensor, TensorEntry};
use crate::cuda::driver_error;
use crate::cuda::kernels::load_function;
use crate::error::Result;

/// A found-inf flag in device memory (0: every value finite so far; 1: some NaN/inf).
#[derive(Debug)]
pub struct FoundInfFlag {
    stream: Arc<CudaStream>,
    flag: CudaSlice<u32>,
}

impl FoundInfFlag {
    /// A zeroed flag on `stream` (the zeroing is enqueued, not waited for).
    pub fn new(stream: &Arc<CudaStream>) -> Result<Self> {
        let flag = stream
            .alloc_zeros::<u32>(1)
            .map_err(|e| driver_error("cuMemAlloc", e))?;
        Ok(FoundInfFlag {
            stream: stream.clone(),
            flag,
        })
    }

    /// Copies the flag to the host (waits for the work enqueued before it on the stream).
    pub fn read(&self) -> Result<bool> {
        let v = self
            .stream
            .clone_dtoh(&self.flag)
            .map_err(|e| driver_error("cuMemcpyDtoH", e))?;
        // The copy into pageable memory is only queued: wait before reading (see `read_result`).
        self.stream
            .synchronize()
            .map_err(|e| driver_error("cuStreamSynchronize", e))?;
        Ok(v[0] != 0)
    }
}

/// Enqueues one unscale-and-check launch over `list` (gradients of any float dtype on the
/// stream's device): every element is multiplied by `inv_scale`, and `found_inf` is set when
/// any element was NaN or infinite before scaling.
pub fn unscale_and_check(
    stream: &Arc<CudaStream>,
    list: &[DeviceTensor],
    inv_scale: f32,
    found_inf: &mut FoundInfFlag,
) -> Result<()> {
    let lens: Vec<usize> = list.iter().map(|t| t.len as usize).collect();
    let (chunk_entries, num_chunks) = chunk_table(&lens)?;
    if chunk_entries.is_empty() {
        return Ok(());
    }
    // `first_chunk`/`num_chunks` of the entries are unused by this kernel.
    let entries = list
        .iter()
        .map(|t| {
            Ok(TensorEntry {
                ptr: t.ptr,
                len: t.len,
                dtype: dtype_code(t.dtype)?,
                first_chunk: 0,
                num_chunks: 0,
                pad: 0,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let upload = |e| driver_error("cuMemcpyHtoD", e);
    let tensors = stream.clone_htod(&entries).map_err(upload)?;
    let chunks = stream.clone_htod(&chunk_entries).map_err(upload)?;
    let function = load_function(stream.context(), &MULTI_TENSOR_KERNELS, "kiln_mt_unscale")?;
    let mut launch = stream.launch_builder(&function);
    launch
        .arg(&tensors)
        .arg(&chunks)
        .arg(&num_chunks)
        .arg(&inv_scale)
        .arg(&mut found_inf.flag);
    // SAFETY: the argument list matches kiln_mt_unscale; every address in the table is a live
    // buffer of `len` elements of its dtype (the caller's contract), written only within it.
    unsafe { launch.launch(chunk_launch_config(num_chunks)) }
        .map_err(|e| driver_error("cuLaunchKernel", e))?;
    Ok(())
}
