//! How the emulated NCCL reports errors: each failure is logged with its call's name, kept as
//! the text `ncclGetLastError` returns, and turned into its `ncclResult_t`; and the communicator
//! lookup every entry point starts with.
//!
//! Invariants: the kept text never contains a NUL; it is replaced, never freed in place, so a
//! pointer handed out by [`last_error`] stays valid until the next error.

use std::ffi::{c_char, CString};
use std::sync::{Arc, Mutex};

use cudarc::nccl::sys::{ncclComm_t, ncclResult_t};

use super::clique::CommError;
use super::comm::{lookup, Comm};
use crate::driver;

/// The last error's text, for `ncclGetLastError`.
static LAST_ERROR: Mutex<Option<CString>> = Mutex::new(None);

/// The result code of `e`.
pub(super) fn code(e: &CommError) -> ncclResult_t {
    match e {
        CommError::InvalidArgument(_) => ncclResult_t::ncclInvalidArgument,
        CommError::InvalidUsage(_) => ncclResult_t::ncclInvalidUsage,
        CommError::Remote(_) => ncclResult_t::ncclRemoteError,
        CommError::System(_) => ncclResult_t::ncclSystemError,
    }
}

/// Logs `e` under `call`, keeps it for `ncclGetLastError`, and returns its result code.
pub(crate) fn fail(call: &str, e: CommError) -> ncclResult_t {
    let result = code(&e);
    let line = format!("{call}: {e} ({result:?})");
    driver::log(&line);
    let text = CString::new(line.replace('\0', " ")).expect("NULs replaced");
    *LAST_ERROR.lock().unwrap_or_else(|p| p.into_inner()) = Some(text);
    result
}

/// Fails `call` with `ncclInvalidArgument` for `what`.
pub(crate) fn arg(call: &str, what: String) -> ncclResult_t {
    fail(call, CommError::InvalidArgument(what))
}

/// Traces `call` and resolves its communicator handle; a null or unknown one fails `call`.
pub(crate) fn comm_of(call: &str, comm: ncclComm_t) -> Result<Arc<Comm>, ncclResult_t> {
    driver::trace(call);
    if comm.is_null() {
        return Err(arg(call, "comm is null".into()));
    }
    lookup(comm as usize).ok_or_else(|| {
        arg(
            call,
            format!("comm {comm:p} is destroyed or was never created"),
        )
    })
}

/// The last error's message as a C string (empty before any error).
pub(super) fn last_error() -> *const c_char {
    let guard = LAST_ERROR.lock().unwrap_or_else(|p| p.into_inner());
    // The CString's buffer stays where it is until the next error replaces it.
    guard.as_ref().map_or(c"".as_ptr(), |s| s.as_ptr())
}
