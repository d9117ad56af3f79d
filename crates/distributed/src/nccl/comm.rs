//! The NCCL communicator handle shared by the communication thread and the works.
//!
//! Invariants: the communicator is aborted at most once and never used after that; it is
//! destroyed on drop unless it was aborted; an asynchronous error is read only while it lives.

use crate::Error;
use cudarc::nccl::sys;
use std::sync::atomic::{AtomicBool, Ordering};

/// The communicator, shared by the communication thread and the works (which abort it on a
/// timeout).
pub(crate) struct Comm {
    pub(crate) raw: sys::ncclComm_t,
    pub(crate) aborted: AtomicBool,
}

// SAFETY: an NCCL communicator may be used from any thread; calls on it are made by the one
// communication thread, except `ncclCommAbort`, which NCCL allows from another thread.
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

impl Comm {
    /// Aborts the communicator once (unblocks every NCCL call on it).
    pub(crate) fn abort(&self) {
        if !self.aborted.swap(true, Ordering::AcqRel) {
            // SAFETY: `raw` is a live communicator; abort frees it, and `aborted` keeps it
            // from being used or freed again.
            let _ = unsafe { cudarc::nccl::result::comm_abort(self.raw) };
        }
    }

    /// The communicator's asynchronous error (a peer that died, a failed network), if any.
    pub(crate) fn async_error(&self) -> Option<sys::ncclResult_t> {
        if self.is_aborted() {
            return None;
        }
        let mut state = sys::ncclResult_t::ncclSuccess;
        // SAFETY: `raw` is live (not aborted); `state` is writable.
        let r = unsafe { sys::ncclCommGetAsyncError(self.raw, &mut state) };
        match (r, state) {
            (sys::ncclResult_t::ncclSuccess, sys::ncclResult_t::ncclSuccess)
            | (sys::ncclResult_t::ncclSuccess, sys::ncclResult_t::ncclInProgress) => None,
            (sys::ncclResult_t::ncclSuccess, bad) | (bad, _) => Some(bad),
        }
    }

    /// The error for a communicator that reported `code`; aborts it.
    pub(crate) fn failure(
        &self,
        rank: usize,
        world_size: usize,
        op: &'static str,
        code: sys::ncclResult_t,
    ) -> Error {
        self.abort();
        let e = Error::Collective {
            rank,
            world_size,
            op,
            msg: format!(
                "NCCL reports {code:?}: a peer rank exited or its connection failed (check the \
                 other ranks' logs for the first error); the communicator was aborted"
            ),
        };
        eprintln!("kiln-distributed: {e}");
        e
    }

    pub(crate) fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if !self.is_aborted() {
            // SAFETY: live and used by nothing else any more (the thread has stopped).
            let _ = unsafe { cudarc::nccl::result::comm_destroy(self.raw) };
        }
    }
}
