//! The NCCL communicator handle shared by the communication thread and the works.
//!
//! Invariants: the communicator is aborted at most once and never used after that; it is
//! destroyed on drop unless it was aborted; an asynchronous error is read only while it lives.
//! Joining ([`Comm::init_rank`]) ends by the group's timeout: NCCL's `ncclCommInitRank` blocks
//! until every rank called it and has no deadline of its own, so it runs on a helper thread that
//! the joining rank stops waiting for; a communicator that thread gets after the rank gave up is
//! aborted there, never used.

use crate::env::LaunchEnv;
use crate::{Error, Result};
use cudarc::driver::{CudaContext, CudaEvent};
use cudarc::nccl::sys;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// A communicator handle on its way from the init thread.
struct Joined(sys::ncclComm_t);
// SAFETY: an NCCL communicator may be handed to and used from another thread.
unsafe impl Send for Joined {}

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
    /// Joins the communicator of unique id `id` as `env`'s rank on `context`'s device; fails
    /// with [`Error::Timeout`] naming this rank when the other ranks have not all joined within
    /// `timeout`.
    pub(crate) fn init_rank(
        env: &LaunchEnv,
        id: sys::ncclUniqueId,
        context: Arc<CudaContext>,
        timeout: Duration,
    ) -> Result<Comm> {
        const OP: &str = "ncclCommInitRank";
        let (rank, world_size) = (env.rank, env.world_size);
        let failed = |msg: String| Error::Collective {
            rank,
            world_size,
            op: OP,
            msg,
        };
        let (tx, rx) = mpsc::channel::<std::result::Result<Joined, String>>();
        std::thread::Builder::new()
            .name("kiln-nccl-init".into())
            .spawn(move || {
                let joined = context
                    .bind_to_thread()
                    .map_err(|e| format!("binding the CUDA context: {e}"))
                    .and_then(|_| {
                        let mut raw: sys::ncclComm_t = std::ptr::null_mut();
                        // SAFETY: `raw` is written by NCCL; the id came from rank 0's
                        // ncclGetUniqueId.
                        unsafe {
                            cudarc::nccl::result::comm_init_rank(
                                &mut raw,
                                world_size as i32,
                                id,
                                rank as i32,
                            )
                        }
                        .map(|_| Joined(raw))
                        .map_err(|e| {
                            format!(
                                "{:?}: check that every rank started and reached the same id",
                                e.0
                            )
                        })
                    });
                if let Err(mpsc::SendError(Ok(late))) = tx.send(joined) {
                    // The rank stopped waiting (timed out): nobody will use this communicator.
                    // SAFETY: a live communicator that nothing else holds.
                    let _ = unsafe { cudarc::nccl::result::comm_abort(late.0) };
                }
            })
            .map_err(|e| failed(format!("cannot start the NCCL init thread: {e}")))?;
        match rx.recv_timeout(timeout) {
            Ok(Ok(Joined(raw))) => Ok(Comm {
                raw,
                aborted: AtomicBool::new(false),
            }),
            Ok(Err(msg)) => Err(failed(msg)),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let e = Error::Timeout {
                    rank,
                    world_size,
                    op: OP,
                    seconds: timeout.as_secs_f64(),
                };
                eprintln!(
                    "kiln-distributed: {e} (every rank fetched the unique id, so a rank stopped \
                     or is stuck before joining NCCL)"
                );
                Err(e)
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(failed(
                "the NCCL init thread stopped (see the panic message above)".into(),
            )),
        }
    }

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

    /// Polls `event` (the end of `op`'s work on a stream) every `poll` until it completes. An
    /// asynchronous error of the communicator fails the wait ([`Comm::failure`]); so does a
    /// device error, and the deadline ([`Error::Timeout`], quoting `timeout`, printed on stderr
    /// at once), both after aborting the communicator. The errors name `rank` of `world_size`.
    pub(crate) fn await_event(
        &self,
        (rank, world_size, op): (usize, usize, &'static str),
        event: &CudaEvent,
        (deadline, timeout): (Instant, Duration),
        poll: Duration,
    ) -> Result<()> {
        loop {
            if let Some(code) = self.async_error() {
                return Err(self.failure(rank, world_size, op, code));
            }
            match event.try_is_complete() {
                Ok(true) => return Ok(()),
                Ok(false) if Instant::now() < deadline => std::thread::sleep(poll),
                Ok(false) => {
                    self.abort();
                    let e = Error::Timeout {
                        rank,
                        world_size,
                        op,
                        seconds: timeout.as_secs_f64(),
                    };
                    eprintln!("kiln-distributed: {e}");
                    return Err(e);
                }
                Err(e) => {
                    self.abort();
                    return Err(Error::Collective {
                        rank,
                        world_size,
                        op,
                        msg: format!("the device reported {e}"),
                    });
                }
            }
        }
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
