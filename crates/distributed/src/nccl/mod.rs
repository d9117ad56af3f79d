//! [`NcclGroup`]: the process group over NCCL (cudarc's `nccl`, loaded at run time) for CUDA
//! tensors on this process's device.
//!
//! Invariants:
//! - One communicator per process, on `cuda:ordinal`; NCCL's unique id is made by rank 0 and
//!   shared at start-up through MPI (with the `mpi` feature under an MPI launcher) or the TCP
//!   rendezvous at `MASTER_ADDR:MASTER_PORT` ([`crate::store`]).
//! - A communication thread makes every NCCL call, in start order, on a dedicated stream; each
//!   collective first all-gathers its [`Signature`] (so a mismatch fails on every rank, naming
//!   the ranks), then waits (on the device) for the event the caller recorded on the compute
//!   stream when it started the work, then runs, then records a completion event that
//!   [`PendingWork::wait`] polls against the deadline.
//! - A work keeps its tensors alive until it was waited for (or dropped after completing), so
//!   their blocks are not reused while NCCL still reads or writes them.
//! - A timeout aborts the communicator (`ncclCommAbort`), after which every collective fails.
//! - Nothing panics without libnccl or libcuda: [`NcclGroup::new`] answers
//!   [`Error::Unavailable`] naming what to install.

mod comm;
mod thread;

use crate::collective::{queued, queued_process_group, CommThread, LocalChecks, Op};
use crate::env::LaunchEnv;
use crate::signature::{check_tensor, Signature};
use crate::{BackendKind, Error, PendingWork, Result};
use comm::Comm;
use cudarc::driver::{CudaEvent, CudaStream};
use cudarc::nccl::sys;
use kiln_autograd::{DType, Device, Tensor};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use thread::Job;

/// The dtypes NCCL carries here.
const NCCL_DTYPES: [DType; 5] = [DType::F32, DType::F64, DType::I64, DType::F16, DType::BF16];

/// One process's handle on an NCCL communicator.
pub struct NcclGroup {
    /// First, so the thread stops before anything else goes (the MPI group last).
    thread: CommThread<Job>,
    rank: usize,
    world_size: usize,
    local_rank: usize,
    ordinal: usize,
    compute: Arc<CudaStream>,
    comm: Arc<Comm>,
    timeout: Duration,
    /// The MPI group the unique id went through; kept so MPI is finalised after NCCL.
    #[cfg(feature = "mpi")]
    _mpi: Option<crate::mpi::MpiGroup>,
}

impl std::fmt::Debug for NcclGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NcclGroup(rank {} of {}, cuda:{})",
            self.rank, self.world_size, self.ordinal
        )
    }
}

/// What to install when libnccl is missing.
pub const NCCL_INSTALL_HINT: &str = "NCCL (libnccl.so.2) was not found: install it \
     (`apt-get install libnccl2`, or `pip install nvidia-nccl-cu13` and put its lib folder on \
     LD_LIBRARY_PATH), or train on the CPU with the MPI backend";

fn unavailable(what: String) -> Error {
    Error::Unavailable(what)
}

/// Rank 0's unique id, on every rank.
fn share_id(env: &LaunchEnv, timeout: Duration) -> Result<(sys::ncclUniqueId, MpiKeep)> {
    let mine = if env.rank == 0 {
        let id = cudarc::nccl::result::get_uniqueid()
            .map_err(|e| unavailable(format!("ncclGetUniqueId failed: {:?}", e.0)))?;
        Some(id.internal.iter().map(|&c| c as u8).collect::<Vec<u8>>())
    } else {
        None
    };
    let len = std::mem::size_of::<sys::ncclUniqueId>();
    let (bytes, keep) = share_bytes(env, mine.as_deref(), len, timeout)?;
    let mut id = sys::ncclUniqueId { internal: [0; 128] };
    for (slot, b) in id.internal.iter_mut().zip(bytes) {
        *slot = b as _;
    }
    Ok((id, keep))
}

#[cfg(feature = "mpi")]
type MpiKeep = Option<crate::mpi::MpiGroup>;
#[cfg(not(feature = "mpi"))]
type MpiKeep = ();

#[cfg(feature = "mpi")]
fn share_bytes(
    env: &LaunchEnv,
    mine: Option<&[u8]>,
    len: usize,
    timeout: Duration,
) -> Result<(Vec<u8>, MpiKeep)> {
    if !env.launcher.is_mpi() {
        return Ok((
            crate::store::share_from_rank0(env, mine, len, timeout)?,
            None,
        ));
    }
    let mpi = crate::mpi::MpiGroup::new(env, timeout)?;
    let words: Vec<i64> = match mine {
        Some(b) => b
            .chunks(8)
            .map(|c| {
                let mut w = [0u8; 8];
                w[..c.len()].copy_from_slice(c);
                i64::from_le_bytes(w)
            })
            .collect(),
        None => vec![0; len.div_ceil(8)],
    };
    let n = words.len();
    let t = Tensor::from_vec(words, &[n], Device::Cpu)?;
    crate::ProcessGroup::broadcast(&mpi, &t, 0)?;
    let bytes: Vec<u8> = t
        .to_vec::<i64>()?
        .into_iter()
        .flat_map(i64::to_le_bytes)
        .take(len)
        .collect();
    Ok((bytes, Some(mpi)))
}

#[cfg(not(feature = "mpi"))]
fn share_bytes(
    env: &LaunchEnv,
    mine: Option<&[u8]>,
    len: usize,
    timeout: Duration,
) -> Result<(Vec<u8>, MpiKeep)> {
    Ok((crate::store::share_from_rank0(env, mine, len, timeout)?, ()))
}

impl NcclGroup {
    /// Joins the NCCL communicator of the job described by `env`, on `cuda:ordinal`.
    pub fn new(env: &LaunchEnv, ordinal: usize, timeout: Duration) -> Result<Self> {
        // SAFETY: only probes whether the library can be loaded.
        if !unsafe { sys::is_culib_present() } {
            return Err(unavailable(NCCL_INSTALL_HINT.into()));
        }
        let compute = kiln_device::cuda_stream(ordinal).map_err(|e| {
            unavailable(format!(
                "rank {}: cuda:{ordinal} is not usable: {e}",
                env.rank
            ))
        })?;
        let context = compute.context().clone();
        let cuda = |what: &'static str| {
            move |e: cudarc::driver::DriverError| unavailable(format!("{what}: {e}"))
        };
        context
            .bind_to_thread()
            .map_err(cuda("binding the CUDA context"))?;
        let stream = context
            .new_stream()
            .map_err(cuda("creating the NCCL stream"))?;
        let (id, keep) = share_id(env, timeout)?;
        let comm = Arc::new(Comm::init_rank(env, id, context, timeout)?);
        let (jobs_tx, jobs_rx) = mpsc::channel();
        let worker = thread::Worker::new(env.rank, env.world_size, comm.clone(), stream, timeout)?;
        let handle = std::thread::Builder::new()
            .name("kiln-nccl".into())
            .spawn(move || worker.serve(jobs_rx))
            .map_err(|e| unavailable(format!("cannot start the NCCL thread: {e}")))?;
        #[cfg(not(feature = "mpi"))]
        let () = keep;
        Ok(NcclGroup {
            thread: CommThread::new(jobs_tx, handle),
            rank: env.rank,
            world_size: env.world_size,
            local_rank: env.local_rank,
            ordinal,
            compute,
            comm,
            timeout,
            #[cfg(feature = "mpi")]
            _mpi: keep,
        })
    }

    /// The CUDA device of this group.
    pub fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }

    /// This transport's checks: tensors on this group's device, of the dtypes NCCL carries here.
    fn checks(&self) -> LocalChecks<impl Fn(&'static str, &Tensor) -> Result<()>> {
        let device = self.device();
        LocalChecks {
            world_size: self.world_size,
            tensor: move |op, t: &Tensor| check_tensor(op, "", t, device, &NCCL_DTYPES),
        }
    }

    /// Queues a collective; its work.
    fn started(&self, name: &'static str, checked: Result<(Signature, Op)>) -> Result<NcclWork> {
        let (signature, op) = queued(checked);
        let tensors = op.tensors();
        // The device point the collective must wait for: what was queued on the compute stream.
        let ready = self
            .compute
            .record_event(None)
            .map_err(|e| self.err(name, format!("recording the start event: {e}")))?;
        let (done, result) = mpsc::channel();
        let job = Job {
            name,
            signature,
            op,
            ready,
            done,
        };
        if !self.thread.send(job) {
            return Err(self.err(name, "the NCCL communication thread has stopped".into()));
        }
        Ok(NcclWork {
            result: Some(result),
            name,
            rank: self.rank,
            world_size: self.world_size,
            comm: self.comm.clone(),
            timeout: self.timeout,
            tensors,
        })
    }

    fn err(&self, op: &'static str, msg: String) -> Error {
        Error::Collective {
            rank: self.rank,
            world_size: self.world_size,
            op,
            msg,
        }
    }
}

/// A started NCCL collective.
struct NcclWork {
    result: Option<mpsc::Receiver<Result<CudaEvent>>>,
    name: &'static str,
    rank: usize,
    world_size: usize,
    comm: Arc<Comm>,
    timeout: Duration,
    /// Kept alive until the collective completed.
    tensors: Vec<Tensor>,
}

impl NcclWork {
    fn finish(&mut self) -> Result<()> {
        let Some(result) = self.result.take() else {
            return Ok(());
        };
        let event = result.recv().unwrap_or_else(|_| {
            Err(Error::Collective {
                rank: self.rank,
                world_size: self.world_size,
                op: self.name,
                msg: "the NCCL communication thread stopped (see the panic message above)".into(),
            })
        })?;
        let deadline = Instant::now() + self.timeout;
        let who = (self.rank, self.world_size, self.name);
        let poll = Duration::from_micros(100);
        self.comm
            .await_event(who, &event, (deadline, self.timeout), poll)?;
        self.tensors.clear();
        Ok(())
    }
}

impl PendingWork for NcclWork {
    fn wait(mut self: Box<Self>) -> Result<()> {
        self.finish()
    }
}

impl Drop for NcclWork {
    fn drop(&mut self) {
        // A work dropped unwaited still must not free its tensors under NCCL.
        let _ = self.finish();
    }
}

queued_process_group!(NcclGroup, BackendKind::Nccl);
