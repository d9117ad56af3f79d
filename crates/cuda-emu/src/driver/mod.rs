//! The CUDA driver API (owner: driver work). PLACEHOLDER: the items below are the contract the
//! cuBLAS and NCCL modules rely on; the implementation replaces the bodies.

use cudarc::driver::sys::{CUresult, CUstream};

/// One piece of stream work: runs on the stream's worker, in order; an `Err` becomes the
/// stream's (and, for faults, the context's sticky) error, returned by the next synchronising call.
pub type StreamWork = Box<dyn FnOnce() -> Result<(), CUresult> + Send + 'static>;

/// Queues `work` on `stream` (null: the current context's default stream) and returns at once.
/// Errors: an invalid or destroyed stream, no current context, a context with a sticky error.
pub fn enqueue(stream: CUstream, work: StreamWork) -> Result<(), CUresult> {
    let _ = (stream, work);
    Err(CUresult::CUDA_ERROR_NOT_SUPPORTED)
}

/// Blocks until everything queued on `stream` so far has run; returns the stream's error if any.
pub fn synchronize_stream(stream: CUstream) -> Result<(), CUresult> {
    let _ = stream;
    Err(CUresult::CUDA_ERROR_NOT_SUPPORTED)
}

/// The ordinal of the current context's device (after `CUDA_VISIBLE_DEVICES` remapping).
pub fn current_device() -> Result<i32, CUresult> {
    Err(CUresult::CUDA_ERROR_INVALID_CONTEXT)
}

/// The ordinal of the device `stream` belongs to (null: the current context's).
pub fn stream_device(stream: CUstream) -> Result<i32, CUresult> {
    let _ = stream;
    Err(CUresult::CUDA_ERROR_INVALID_HANDLE)
}

/// Writes one log line to stderr, prefixed `kiln-cuda-emu: ` (always for errors; for calls only
/// under `KILN_EMU_LOG=1`).
pub fn log(message: &str) {
    eprintln!("kiln-cuda-emu: {message}");
}
