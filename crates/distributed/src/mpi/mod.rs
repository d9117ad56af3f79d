//! [`MpiGroup`]: the process group over MPI (rsmpi over the system's Open MPI) for CPU
//! tensors of `f32`, `f64` and `i64`.
//!
//! Invariants:
//! - One communication thread owns MPI (it initialises it, makes every call and finalises it),
//!   so MPI sees a single thread; collectives run there one at a time in the order they were
//!   started, which is the order works complete in.
//! - Every collective first exchanges its [`Signature`] with an all-gather, so ranks that issued
//!   different collectives (or a rank that refused its own arguments) fail together with a
//!   message naming the ranks; only then do tensor bytes move.
//! - Each MPI call is nonblocking and polled against a deadline (`KILN_DIST_TIMEOUT`): a peer
//!   that hangs or died makes this rank fail with [`Error::Timeout`] naming the collective and
//!   the rank, printed at once on stderr. The group is then unusable (the timed-out request is
//!   still in MPI's hands, so its buffers are leaked on purpose, and MPI is not finalised: a
//!   finalise would wait for the dead peer); `mpirun` then stops the job and names this rank.
//! - A tensor is copied out of its buffer before the call and written back after it, under the
//!   buffer's lock, so a failed collective leaves the tensor as it was.

use crate::collective::{queued, queued_process_group, CommThread, LocalChecks, Op};
use crate::env::{LaunchEnv, Launcher};
use crate::signature::{check_tensor, Signature};
use crate::{BackendKind, Error, PendingWork, Result};
use ::mpi::traits::*;
use kiln_autograd::{DType, Device, Tensor};
use std::sync::mpsc;
use std::time::Duration;

mod transfer;
use transfer::Ctx;

/// The dtypes MPI carries here.
const MPI_DTYPES: [DType; 3] = [DType::F32, DType::F64, DType::I64];

struct Job {
    name: &'static str,
    signature: Signature,
    op: Op,
    done: mpsc::Sender<Result<()>>,
}

/// One process's handle on the MPI job's world communicator.
pub struct MpiGroup {
    /// First, so the thread stops before anything else goes: it finalises MPI (or, after a
    /// timeout, leaves that to `mpirun`).
    thread: CommThread<Job>,
    rank: usize,
    world_size: usize,
    local_rank: usize,
}

impl std::fmt::Debug for MpiGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MpiGroup(rank {} of {})", self.rank, self.world_size)
    }
}

impl MpiGroup {
    /// Initialises MPI on a communication thread and joins its world communicator. `env` gives
    /// the local rank (and, under an MPI launcher, must agree with MPI's rank and size);
    /// `timeout` bounds every collective.
    pub fn new(env: &LaunchEnv, timeout: Duration) -> Result<Self> {
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(usize, usize)>>();
        let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("kiln-mpi".into())
            .spawn(move || serve(ready_tx, jobs_rx, timeout))
            .map_err(|e| Error::Unavailable(format!("cannot start the MPI thread: {e}")))?;
        let (rank, world_size) = ready_rx.recv().map_err(|_| {
            Error::Unavailable("the MPI thread stopped while initialising MPI".into())
        })??;
        if env.launcher != Launcher::Single && (env.rank != rank || env.world_size != world_size) {
            return Err(Error::Environment(format!(
                "MPI says rank {rank} of {world_size} but the launch environment ({:?}) says \
                 rank {} of {}; unset the other launcher's variables",
                env.launcher, env.rank, env.world_size
            )));
        }
        Ok(MpiGroup {
            thread: CommThread::new(jobs_tx, thread),
            rank,
            world_size,
            local_rank: env.local_rank,
        })
    }

    fn collective_err(&self, op: &'static str, msg: &str) -> Error {
        Error::Collective {
            rank: self.rank,
            world_size: self.world_size,
            op,
            msg: msg.to_string(),
        }
    }

    /// Queues a collective; its work.
    fn started(&self, name: &'static str, checked: Result<(Signature, Op)>) -> Result<MpiWork> {
        let (signature, op) = queued(checked);
        let (done, result) = mpsc::channel();
        let job = Job {
            name,
            signature,
            op,
            done,
        };
        if !self.thread.send(job) {
            return Err(self.collective_err(name, "the MPI communication thread has stopped"));
        }
        Ok(MpiWork {
            result,
            name,
            rank: self.rank,
            world_size: self.world_size,
        })
    }

    /// This transport's checks: CPU tensors of the dtypes MPI carries here.
    fn checks(&self) -> LocalChecks<impl Fn(&'static str, &Tensor) -> Result<()>> {
        LocalChecks {
            world_size: self.world_size,
            tensor: |op, t: &Tensor| check_tensor(op, "", t, Device::Cpu, &MPI_DTYPES),
        }
    }
}

/// The result of a queued collective.
struct MpiWork {
    result: mpsc::Receiver<Result<()>>,
    name: &'static str,
    rank: usize,
    world_size: usize,
}

impl MpiWork {
    fn finish(self) -> Result<()> {
        // The thread answers every job (each call is bounded by the timeout), so this ends.
        self.result.recv().unwrap_or_else(|_| {
            Err(Error::Collective {
                rank: self.rank,
                world_size: self.world_size,
                op: self.name,
                msg: "the MPI communication thread stopped (see the panic message above)".into(),
            })
        })
    }
}

impl PendingWork for MpiWork {
    fn wait(self: Box<Self>) -> Result<()> {
        self.finish()
    }
}

queued_process_group!(MpiGroup, BackendKind::Mpi);

/// The communication thread: initialises MPI, reports rank and size, runs the jobs in order.
fn serve(
    ready: mpsc::Sender<Result<(usize, usize)>>,
    jobs: mpsc::Receiver<Job>,
    timeout: Duration,
) {
    let Some((universe, _threading)) =
        ::mpi::initialize_with_threading(::mpi::Threading::Serialized)
    else {
        let _ = ready.send(Err(Error::Unavailable(
            "MPI is already initialised in this process: make one MpiGroup per process (keep \
             the Arc that init_process_group returned)"
                .into(),
        )));
        return;
    };
    let world = universe.world();
    let rank = world.rank() as usize;
    let world_size = world.size() as usize;
    if ready.send(Ok((rank, world_size))).is_err() {
        return;
    }
    let ctx = Ctx {
        world,
        rank,
        world_size,
        timeout,
    };
    let mut broken: Option<String> = None;
    for job in jobs {
        let Job {
            name,
            signature,
            op,
            done,
        } = job;
        let result = match &broken {
            Some(why) => Err(Error::Collective {
                rank,
                world_size,
                op: name,
                msg: format!(
                    "not run: an earlier collective failed and left MPI unusable ({why}); \
                     stop this process"
                ),
            }),
            None => ctx.run(name, signature, op),
        };
        if let Err(e @ Error::Timeout { .. }) = &result {
            eprintln!("kiln-distributed: {e}");
            broken = Some(e.to_string());
        }
        let _ = done.send(result);
    }
    if broken.is_some() {
        // MPI_Finalize would wait for the peer that never answered.
        std::mem::forget(universe);
    }
}
