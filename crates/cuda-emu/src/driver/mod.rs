//! The CUDA driver API: initialisation and devices ([`device`]), primary contexts
//! ([`context`]), streams and events ([`events`], `stream`), memory ([`memory`]), copies and
//! fills ([`copy`]), modules and launches ([`launch`]), virtual memory management ([`vmm`]).
//!
//! Invariants: every entry point that needs a context checks, in this order, that `cuInit`
//! succeeded, that the thread has a current context, and that the context has no sticky error;
//! every misuse the emulator detects beyond a plain bad handle or null out-pointer (wrong memory,
//! wrong direction, launch limits, VMM rules, capacity, a bad configuration) is logged with the
//! call's name before its status is returned; device work never runs on the calling thread, only
//! on a stream's worker.

mod config;
pub mod context;
pub mod copy;
pub mod device;
pub mod errors;
pub mod events;
pub mod launch;
pub mod memory;
mod pinned;
pub(crate) mod stream;
pub mod vmm;

pub use self::context::*;
pub use self::copy::*;
pub use self::device::*;
pub use self::errors::*;
pub use self::events::*;
pub use self::launch::*;
pub use self::memory::*;
pub use self::vmm::*;

pub(crate) use self::context::trace;

use cudarc::driver::sys::CUresult;

/// One piece of stream work: runs on the stream's worker, in order; an `Err` becomes the
/// stream's (and, for faults, the context's sticky) error, returned by the next synchronising call.
pub type StreamWork = Box<dyn FnOnce() -> Result<(), CUresult> + Send + 'static>;

/// Writes one log line to stderr, prefixed `kiln-cuda-emu: ` (always for errors; for calls only
/// under `KILN_EMU_LOG=1`).
pub fn log(message: &str) {
    eprintln!("kiln-cuda-emu: {message}");
}

/// Logs `message` for `call` and returns `code` (for errors the emulator detects).
pub(crate) fn fail(call: &str, code: CUresult, message: impl std::fmt::Display) -> CUresult {
    log(&format!("{call}: {message} ({code:?})"));
    code
}

/// Writes `value` through the caller's out-pointer; `CUDA_ERROR_INVALID_VALUE` when it is null.
///
/// # Safety
/// `ptr` is null or valid for a write of `T`.
pub(crate) unsafe fn out<T>(ptr: *mut T, value: T) -> CUresult {
    if ptr.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: not null; the caller guarantees it is writable.
    unsafe { ptr.write(value) };
    CUresult::CUDA_SUCCESS
}

/// The status of a result (`CUDA_SUCCESS` for `Ok`).
pub(crate) fn status(r: Result<(), CUresult>) -> CUresult {
    r.err().unwrap_or(CUresult::CUDA_SUCCESS)
}
