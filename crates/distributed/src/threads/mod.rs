//! The threads backend: a [`ProcessGroup`] whose ranks are threads of one process (tests and
//! single-host experiments; [`BackendKind::Threads`]).
//!
//! Invariants:
//! - Each rank owns one communication thread that runs its collectives one at a time, in the
//!   order they were started, so works complete in start order, and `start_all_reduce` returns
//!   while the caller's thread goes on (backward keeps running while a bucket is reduced).
//! - The `k`-th collective of every rank meets in rendezvous slot `k`. Each rank deposits a copy
//!   of its input and what it issued (the collective, its element count, dtype, root); once
//!   every rank deposited, each rank computes its own output from all inputs. Reductions run in
//!   rank order `0, 1, .., n-1` in one fixed arithmetic (f64 for F64 and integer tensors, f32
//!   for F32, F16 and BF16, rounded once to the dtype), so every rank gets bit-identical results
//!   and a run is reproducible.
//! - Nothing waits forever: a rank whose handle was dropped (its thread returned or panicked)
//!   makes every collective that needs it fail at once with an error naming it; a rank that
//!   stops issuing collectives makes the others fail with [`Error::Timeout`] after the group's
//!   timeout; ranks that issued different collectives get an error naming both.

mod values;

use crate::{BackendKind, Error, PendingWork, ProcessGroup, ReduceOp, Result};
use kiln_autograd::{DType, Tensor};
use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use values::{reduce_ranks, write, Values};

/// The timeout of [`ThreadGroup::new_group`]: a collective waits this long for its peers.
pub const DEFAULT_THREAD_TIMEOUT: Duration = Duration::from_secs(60);

/// What one rank issued, compared across ranks before any data is combined.
#[derive(Clone, Debug, PartialEq)]
struct Issued {
    op: &'static str,
    numel: usize,
    dtype: DType,
    detail: String,
}

impl std::fmt::Display for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}({} elements of {}{})",
            self.op, self.numel, self.dtype, self.detail
        )
    }
}

/// One collective's meeting point.
struct Slot {
    issued: Vec<Option<Issued>>,
    inputs: Vec<Option<Arc<Values>>>,
    finished: usize,
}

struct Rendezvous {
    slots: HashMap<u64, Slot>,
    /// `Some(reason)` for ranks whose handle was dropped.
    departed: Vec<Option<String>>,
}

struct Shared {
    world_size: usize,
    timeout: Duration,
    state: Mutex<Rendezvous>,
    changed: Condvar,
}

enum Job {
    AllReduce(Tensor, ReduceOp),
    Broadcast(Tensor, usize),
    AllGather(Tensor, Tensor),
    ReduceScatter(Tensor, Tensor, ReduceOp),
    Barrier,
}

type Request = (Job, Sender<Result<()>>);

/// One rank's handle on a group of threads. Make all of them with [`ThreadGroup::new_group`] and
/// move each into its own thread.
pub struct ThreadGroup {
    rank: usize,
    shared: Arc<Shared>,
    requests: Option<Mutex<Sender<Request>>>,
    worker: Option<JoinHandle<()>>,
    /// Ranks on threads of one process run their passes op by op (`OpByOp`).
    _op_by_op: kiln_device::threads::OpByOp,
}

impl std::fmt::Debug for ThreadGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadGroup")
            .field("rank", &self.rank)
            .field("world_size", &self.shared.world_size)
            .field("timeout", &self.shared.timeout)
            .finish()
    }
}

impl ThreadGroup {
    /// The handles of a new group of `world_size` ranks (index = rank), with
    /// [`DEFAULT_THREAD_TIMEOUT`].
    pub fn new_group(world_size: usize) -> Result<Vec<ThreadGroup>> {
        Self::with_timeout(world_size, DEFAULT_THREAD_TIMEOUT)
    }

    /// [`ThreadGroup::new_group`] with the time a collective waits for its peers.
    pub fn with_timeout(world_size: usize, timeout: Duration) -> Result<Vec<ThreadGroup>> {
        if world_size == 0 {
            return Err(Error::InvalidArgument {
                op: "ThreadGroup::new_group",
                msg: "world_size is 0; a group needs at least one rank".into(),
            });
        }
        let shared = Arc::new(Shared {
            world_size,
            timeout,
            state: Mutex::new(Rendezvous {
                slots: HashMap::new(),
                departed: vec![None; world_size],
            }),
            changed: Condvar::new(),
        });
        (0..world_size)
            .map(|rank| {
                let (tx, rx) = channel::<Request>();
                let worker_shared = shared.clone();
                let worker = std::thread::Builder::new()
                    .name(format!("kiln-dist-rank{rank}"))
                    .spawn(move || run_worker(rank, &worker_shared, rx))
                    .map_err(|e| {
                        Error::Unavailable(format!("cannot start rank {rank}'s thread: {e}"))
                    })?;
                Ok(ThreadGroup {
                    rank,
                    shared: shared.clone(),
                    requests: Some(Mutex::new(tx)),
                    worker: Some(worker),
                    _op_by_op: kiln_device::threads::OpByOp::hold(),
                })
            })
            .collect()
    }

    /// Runs `f` once per rank, each on its own thread with its rank's handle, and returns the
    /// results in rank order. A rank that panics is reported as an error naming it (the others
    /// then fail their next collective with it rather than hang).
    pub fn run<T: Send>(
        world_size: usize,
        timeout: Duration,
        f: impl Fn(ThreadGroup) -> T + Sync,
    ) -> Result<Vec<T>> {
        let groups = Self::with_timeout(world_size, timeout)?;
        let f = &f;
        std::thread::scope(|scope| {
            let running: Vec<_> = groups
                .into_iter()
                .map(|g| scope.spawn(move || f(g)))
                .collect();
            running
                .into_iter()
                .enumerate()
                .map(|(rank, h)| {
                    h.join().map_err(|_| Error::Collective {
                        rank,
                        world_size,
                        op: "ThreadGroup::run",
                        msg: "this rank's thread panicked".into(),
                    })
                })
                .collect()
        })
    }

    /// The time a collective waits for its peers before failing.
    pub fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    fn err(&self, op: &'static str, msg: String) -> Error {
        Error::Collective {
            rank: self.rank,
            world_size: self.shared.world_size,
            op,
            msg,
        }
    }

    fn check_tensor(&self, op: &'static str, what: &str, t: &Tensor) -> Result<()> {
        if !t.is_contiguous() {
            return Err(self.err(
                op,
                format!("the {what} tensor is not contiguous; pass .contiguous() of it"),
            ));
        }
        Ok(())
    }

    fn submit(&self, op: &'static str, job: Job) -> Result<Box<dyn PendingWork>> {
        let (reply, done) = channel();
        let sent = self.requests.as_ref().map(|r| {
            r.lock()
                .unwrap_or_else(|p| p.into_inner())
                .send((job, reply))
        });
        if !matches!(sent, Some(Ok(()))) {
            return Err(self.err(op, "this rank's communication thread has stopped".into()));
        }
        Ok(Box::new(ThreadWork {
            rank: self.rank,
            world_size: self.shared.world_size,
            op,
            done,
        }))
    }
}

impl Drop for ThreadGroup {
    fn drop(&mut self) {
        // Closing the queue lets the worker finish what was started, then mark the rank gone.
        self.requests = None;
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

struct ThreadWork {
    rank: usize,
    world_size: usize,
    op: &'static str,
    done: Receiver<Result<()>>,
}

impl PendingWork for ThreadWork {
    fn wait(self: Box<Self>) -> Result<()> {
        self.done.recv().unwrap_or_else(|_| {
            Err(Error::Collective {
                rank: self.rank,
                world_size: self.world_size,
                op: self.op,
                msg: "the communication thread stopped before finishing the collective".into(),
            })
        })
    }
}

impl ProcessGroup for ThreadGroup {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.shared.world_size
    }
    fn local_rank(&self) -> usize {
        self.rank
    }
    fn backend(&self) -> BackendKind {
        BackendKind::Threads
    }

    fn start_all_reduce(&self, tensor: &Tensor, op: ReduceOp) -> Result<Box<dyn PendingWork>> {
        self.check_tensor("all_reduce", "", tensor)?;
        if op == ReduceOp::Avg && !tensor.dtype().is_float() {
            return Err(self.err(
                "all_reduce",
                format!(
                    "ReduceOp::Avg needs a float tensor, got {}; use Sum",
                    tensor.dtype()
                ),
            ));
        }
        self.submit("all_reduce", Job::AllReduce(tensor.clone(), op))
    }

    fn broadcast(&self, tensor: &Tensor, root: usize) -> Result<()> {
        self.check_tensor("broadcast", "", tensor)?;
        if root >= self.shared.world_size {
            return Err(self.err(
                "broadcast",
                format!("root {root} is not a rank (0..{})", self.shared.world_size),
            ));
        }
        self.submit("broadcast", Job::Broadcast(tensor.clone(), root))?
            .wait()
    }

    fn all_gather(&self, input: &Tensor, output: &Tensor) -> Result<()> {
        self.check_tensor("all_gather", "input", input)?;
        self.check_tensor("all_gather", "output", output)?;
        check_scaled("all_gather", self, output, input)?;
        self.submit("all_gather", Job::AllGather(input.clone(), output.clone()))?
            .wait()
    }

    fn reduce_scatter(&self, input: &Tensor, output: &Tensor, op: ReduceOp) -> Result<()> {
        self.check_tensor("reduce_scatter", "input", input)?;
        self.check_tensor("reduce_scatter", "output", output)?;
        check_scaled("reduce_scatter", self, input, output)?;
        self.submit(
            "reduce_scatter",
            Job::ReduceScatter(input.clone(), output.clone(), op),
        )?
        .wait()
    }

    fn barrier(&self) -> Result<()> {
        self.submit("barrier", Job::Barrier)?.wait()
    }
}

/// Requires `big` to hold `world_size` times `small`'s elements, in `small`'s dtype.
fn check_scaled(op: &'static str, g: &ThreadGroup, big: &Tensor, small: &Tensor) -> Result<()> {
    let want = small.numel().checked_mul(g.shared.world_size);
    if want != Some(big.numel()) || big.dtype() != small.dtype() {
        return Err(g.err(
            op,
            format!(
                "the gathered side must have world_size ({}) times the other's {} elements and \
                 its dtype {}, but has {} elements of {}",
                g.shared.world_size,
                small.numel(),
                small.dtype(),
                big.numel(),
                big.dtype()
            ),
        ));
    }
    Ok(())
}

fn run_worker(rank: usize, shared: &Shared, requests: Receiver<Request>) {
    let mut seq = 0u64;
    while let Ok((job, reply)) = requests.recv() {
        let result = run_job(rank, shared, seq, job);
        seq += 1;
        let _ = reply.send(result);
    }
    let mut state = shared.state.lock().unwrap_or_else(|p| p.into_inner());
    state.departed[rank] = Some(format!(
        "rank {rank} left the group (its handle was dropped: its thread returned or panicked) \
         after {seq} collectives"
    ));
    drop(state);
    shared.changed.notify_all();
}

/// What a job issues and the data it contributes.
fn contribution(job: &Job) -> Result<(Issued, Values)> {
    let issued = |op, t: &Tensor, detail: String| Issued {
        op,
        numel: t.numel(),
        dtype: t.dtype(),
        detail,
    };
    Ok(match job {
        Job::AllReduce(t, op) => (issued("all_reduce", t, format!(", {op:?}")), Values::of(t)?),
        Job::Broadcast(t, root) => (
            issued("broadcast", t, format!(", root {root}")),
            Values::of(t)?,
        ),
        Job::AllGather(i, _) => (issued("all_gather", i, String::new()), Values::of(i)?),
        Job::ReduceScatter(i, _, op) => (
            issued("reduce_scatter", i, format!(", {op:?}")),
            Values::of(i)?,
        ),
        Job::Barrier => (
            Issued {
                op: "barrier",
                numel: 0,
                dtype: DType::F32,
                detail: String::new(),
            },
            Values::F64(Vec::new()),
        ),
    })
}

fn run_job(rank: usize, shared: &Shared, seq: u64, job: Job) -> Result<()> {
    let (issued, data) = contribution(&job)?;
    let op = issued.op;
    let inputs = exchange(rank, shared, seq, issued, data)?;
    match job {
        Job::AllReduce(t, reduce) => write(
            &t,
            reduce_ranks(&inputs, 0, t.numel(), t.dtype(), reduce, shared.world_size),
        ),
        Job::Broadcast(t, root) => write(&t, (*inputs[root]).clone()),
        Job::AllGather(_, out) => write(&out, Values::concat(&inputs)),
        Job::ReduceScatter(_, out, reduce) => {
            let n = out.numel();
            write(
                &out,
                reduce_ranks(&inputs, rank * n, n, out.dtype(), reduce, shared.world_size),
            )
        }
        Job::Barrier => Ok(()),
    }
    .map_err(|e| Error::Collective {
        rank,
        world_size: shared.world_size,
        op,
        msg: format!("writing the result failed: {e}"),
    })
}

/// Deposits this rank's part of collective `seq` and returns every rank's, once all are there.
fn exchange(
    rank: usize,
    shared: &Shared,
    seq: u64,
    issued: Issued,
    data: Values,
) -> Result<Vec<Arc<Values>>> {
    let n = shared.world_size;
    let op = issued.op;
    let fail = |msg: String| Error::Collective {
        rank,
        world_size: n,
        op,
        msg,
    };
    let deadline = Instant::now() + shared.timeout;
    let mut state = shared.state.lock().unwrap_or_else(|p| p.into_inner());
    let slot = state.slots.entry(seq).or_insert_with(|| Slot {
        issued: vec![None; n],
        inputs: vec![None; n],
        finished: 0,
    });
    slot.issued[rank] = Some(issued.clone());
    slot.inputs[rank] = Some(Arc::new(data));
    shared.changed.notify_all();
    loop {
        let slot = state
            .slots
            .get(&seq)
            .expect("a slot lives until every rank read it");
        if let Some((other, theirs)) = slot
            .issued
            .iter()
            .enumerate()
            .find_map(|(r, i)| i.as_ref().filter(|i| **i != issued).map(|i| (r, i.clone())))
        {
            return Err(fail(format!(
                "collective #{seq}: this rank issued {issued} but rank {other} issued {theirs}; \
                 every rank must issue the same collectives in the same order"
            )));
        }
        if slot.inputs.iter().all(Option::is_some) {
            let inputs: Vec<_> = slot.inputs.iter().flatten().cloned().collect();
            let slot = state.slots.get_mut(&seq).expect("checked above");
            slot.finished += 1;
            if slot.finished == n {
                state.slots.remove(&seq);
            }
            return Ok(inputs);
        }
        let missing: Vec<usize> = (0..n).filter(|&r| slot.inputs[r].is_none()).collect();
        if let Some(reason) = missing.iter().find_map(|&r| state.departed[r].clone()) {
            return Err(fail(format!("collective #{seq} cannot finish: {reason}")));
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::Timeout {
                rank,
                world_size: n,
                op,
                seconds: shared.timeout.as_secs_f64(),
            });
        }
        state = shared
            .changed
            .wait_timeout(state, deadline - now)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}
