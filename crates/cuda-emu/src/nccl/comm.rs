//! Communicators: one rank's membership of a [`Clique`], the registry that turns C handles into
//! them, and the per-thread group state of `ncclGroupStart`/`ncclGroupEnd`. Invariants:
//! - A C handle is an opaque token, never reused: a null, destroyed or made-up communicator is
//!   recognised (`ncclInvalidArgument`), never dereferenced.
//! - A communicator's operations are numbered in call order; every rank must issue the same
//!   sequence (checked by [`collective::run`]). Queued work holds the communicator alive, so
//!   destroying it with work in flight is safe; `ncclCommDestroy` waits for that work first.
//! - Once an operation fails (timeout, dead or departed peer, mismatch, a buffer freed before
//!   the work ran), the communicator keeps the error (`ncclCommGetAsyncError`), refuses further
//!   operations, and its rank is marked failed in the clique so its peers stop waiting for it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cudarc::driver::sys::CUstream;

use super::clique::{Clique, CommError};
use super::collective::{self, Access, Collective};
use super::p2p::{self, P2pOp};
use crate::driver::StreamWork;

/// One rank of a communicator.
pub struct Comm {
    clique: Arc<Clique>,
    /// This rank.
    pub rank: usize,
    /// Ranks in the communicator.
    pub nranks: usize,
    /// The (emulated) CUDA device this rank's buffers and streams live on.
    pub device: i32,
    next_seq: AtomicU64,
    pending: AtomicUsize,
    aborted: AtomicBool,
    error: Mutex<Option<CommError>>,
}

impl Comm {
    /// Joins `id_name` as `rank` of `nranks` without waiting for the others (see
    /// [`Comm::ready`]); data moves through slots of `slot_bytes` (the C API: [`super::clique::SLOT_BYTES`]).
    pub fn join(
        id_name: &str,
        nranks: usize,
        rank: usize,
        device: i32,
        slot_bytes: usize,
        timeout: Duration,
    ) -> Result<Arc<Comm>, CommError> {
        let clique = Arc::new(Clique::open(id_name, nranks, slot_bytes, timeout)?);
        Comm::join_clique(clique, rank, device)
    }

    /// Joins an already mapped clique as `rank`.
    pub fn join_clique(
        clique: Arc<Clique>,
        rank: usize,
        device: i32,
    ) -> Result<Arc<Comm>, CommError> {
        clique.arrive(rank)?;
        Ok(Arc::new(Comm {
            nranks: clique.nranks(),
            clique,
            rank,
            device,
            next_seq: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
            aborted: AtomicBool::new(false),
            error: Mutex::new(None),
        }))
    }

    /// [`Comm::join`], then waits until every rank has arrived.
    pub fn init_rank(
        id_name: &str,
        nranks: usize,
        rank: usize,
        device: i32,
        slot_bytes: usize,
        timeout: Duration,
    ) -> Result<Arc<Comm>, CommError> {
        let comm = Comm::join(id_name, nranks, rank, device, slot_bytes, timeout)?;
        comm.ready()?;
        Ok(comm)
    }

    /// Waits until every rank has arrived.
    pub fn ready(&self) -> Result<(), CommError> {
        self.clique
            .wait_arrivals(self.rank)
            .inspect_err(|e| self.record(e.clone()))
    }

    fn lock_error(&self) -> MutexGuard<'_, Option<CommError>> {
        self.error.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(&self, e: CommError) {
        self.lock_error().get_or_insert(e);
    }

    /// Keeps `e` as the communicator's error and marks this rank failed in the clique, so peers
    /// waiting for it stop at once instead of timing out.
    pub fn record_failure(&self, e: &CommError) {
        self.record(e.clone());
        self.clique.leave(self.rank, true);
    }

    /// The first error an operation of this communicator hit, if any.
    pub fn async_error(&self) -> Option<CommError> {
        self.lock_error().clone()
    }

    /// Errors when the communicator was aborted or has failed.
    pub fn usable(&self) -> Result<(), CommError> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(CommError::InvalidUsage(
                "the communicator was aborted".into(),
            ));
        }
        match self.async_error() {
            Some(e) => Err(CommError::InvalidUsage(format!(
                "the communicator failed earlier: {e}"
            ))),
            None => Ok(()),
        }
    }

    /// Reserves the sequence number of this rank's next operation.
    pub fn next_seq(&self) -> u64 {
        self.next_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Runs operation `seq` now, on this thread (a stream worker, or a test).
    ///
    /// # Safety
    /// As [`collective::run`].
    pub unsafe fn execute(
        &self,
        seq: u64,
        c: &Collective,
        buffers: (u64, u64),
        access: Access<'_>,
    ) -> Result<(), CommError> {
        self.usable()?;
        // SAFETY: forwarded from the caller.
        let result = unsafe { collective::run(&self.clique, self.rank, seq, c, buffers, access) };
        result.inspect_err(|e| self.record_failure(e))
    }

    /// Runs point-to-point operations now, progressing together (a stream worker, or a test).
    ///
    /// # Safety
    /// As [`p2p::run`].
    pub unsafe fn execute_p2p(&self, ops: &[P2pOp], access: Access<'_>) -> Result<(), CommError> {
        self.usable()?;
        // SAFETY: forwarded from the caller.
        let result = unsafe { p2p::run(&self.clique, self.rank, ops, access) };
        result.inspect_err(|e| self.record_failure(e))
    }

    /// Runs the next operation now (tests, and the pure API).
    ///
    /// # Safety
    /// As [`collective::run`].
    pub unsafe fn run_now(&self, c: &Collective, send: u64, recv: u64) -> Result<(), CommError> {
        let seq = self.next_seq();
        // SAFETY: forwarded from the caller.
        unsafe { self.execute(seq, c, (send, recv), &collective::unguarded) }
    }

    /// Counts one piece of work queued on a stream until the returned token is dropped (when
    /// the work has run, or was dropped unrun).
    pub fn queue_token(self: &Arc<Comm>) -> QueuedWork {
        self.pending.fetch_add(1, Ordering::AcqRel);
        QueuedWork(self.clone())
    }

    /// Waits (up to the timeout) for queued work, then leaves the clique.
    pub fn destroy(&self) -> Result<(), CommError> {
        let start = Instant::now();
        while self.pending.load(Ordering::Acquire) > 0 {
            if start.elapsed() >= self.clique.timeout() {
                self.clique.leave(self.rank, true);
                return Err(CommError::System(format!(
                    "ncclCommDestroy: rank {}'s queued operations did not finish within {:.1} s",
                    self.rank,
                    self.clique.timeout().as_secs_f64()
                )));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        self.clique.leave(self.rank, false);
        Ok(())
    }

    /// Stops the communicator at once: queued operations fail, peers waiting for this rank stop.
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        self.clique.leave(self.rank, false);
    }
}

/// A communicator with one piece of queued work outstanding (see [`Comm::queue_token`]).
pub struct QueuedWork(Arc<Comm>);

impl std::ops::Deref for QueuedWork {
    type Target = Comm;
    fn deref(&self) -> &Comm {
        &self.0
    }
}

impl Drop for QueuedWork {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

static COMMS: Mutex<Option<HashMap<usize, Arc<Comm>>>> = Mutex::new(None);
static NEXT_TOKEN: AtomicUsize = AtomicUsize::new(0x4cc1_0000_0000);

fn comms() -> MutexGuard<'static, Option<HashMap<usize, Arc<Comm>>>> {
    COMMS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Registers `comm` and returns its C handle token.
pub fn register(comm: Arc<Comm>) -> usize {
    let token = NEXT_TOKEN.fetch_add(16, Ordering::Relaxed);
    comms().get_or_insert_with(HashMap::new).insert(token, comm);
    token
}

/// The communicator of a C handle token.
pub fn lookup(token: usize) -> Option<Arc<Comm>> {
    comms().as_ref().and_then(|m| m.get(&token).cloned())
}

/// Removes a C handle token; its communicator lives on while work holds it.
pub fn unregister(token: usize) -> Option<Arc<Comm>> {
    comms().as_mut().and_then(|m| m.remove(&token))
}

/// Operations and initialisations deferred to the outermost `ncclGroupEnd` of this thread.
#[derive(Default)]
pub struct Group {
    /// Nesting depth of `ncclGroupStart`.
    pub depth: usize,
    /// Collectives to queue, in call order.
    pub ops: Vec<(CUstream, StreamWork)>,
    /// Communicators whose arrival wait is deferred.
    pub inits: Vec<Arc<Comm>>,
    /// Sends and receives, run together per communicator and stream at the group's end.
    pub p2p: Vec<(Arc<Comm>, CUstream, P2pOp)>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

/// Runs `f` on this thread's group state.
pub fn with_group<R>(f: impl FnOnce(&mut Group) -> R) -> R {
    GROUP.with(|g| f(&mut g.borrow_mut()))
}
