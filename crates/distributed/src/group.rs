//! The process group: the contract between the backends (MPI, NCCL) and what uses them
//! (DistributedDataParallel, ZeRO-1, the recipe).
//!
//! Invariants: collectives are issued in the same order on every rank; each works in place on
//! contiguous tensors; an asynchronous collective's tensors must not be read or written by the
//! caller until its [`PendingWork::wait`] returns; works complete in the order they were started.

use crate::Result;
use kiln_autograd::Tensor;

/// How values from every rank are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// The sum over ranks.
    Sum,
    /// The mean over ranks (the sum divided by the world size).
    Avg,
    /// The maximum over ranks.
    Max,
}

/// Which transport a group runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// NCCL, for CUDA devices.
    Nccl,
    /// MPI, for CPU hosts.
    Mpi,
    /// Threads of one process (tests and single-host experiments).
    Threads,
}

/// A collective that was started and has not been waited for.
pub trait PendingWork: Send {
    /// Blocks until the collective finished on this rank (its output is then readable), or
    /// returns its error (a timeout names the collective and the rank).
    fn wait(self: Box<Self>) -> Result<()>;
}

/// One process's handle on a group of `world_size` processes.
pub trait ProcessGroup: Send + Sync {
    /// This process's rank, `0..world_size`.
    fn rank(&self) -> usize;
    /// The number of processes.
    fn world_size(&self) -> usize;
    /// The rank of this process among those on its host (chooses its device).
    fn local_rank(&self) -> usize;
    /// The transport.
    fn backend(&self) -> BackendKind;
    /// Combines `tensor` over every rank with `op`, in place; starts it and returns at once.
    fn start_all_reduce(&self, tensor: &Tensor, op: ReduceOp) -> Result<Box<dyn PendingWork>>;
    /// [`ProcessGroup::start_all_reduce`] and wait.
    fn all_reduce(&self, tensor: &Tensor, op: ReduceOp) -> Result<()> {
        self.start_all_reduce(tensor, op)?.wait()
    }
    /// Overwrites `tensor` on every rank with rank `root`'s values.
    fn broadcast(&self, tensor: &Tensor, root: usize) -> Result<()>;
    /// Writes every rank's `input` into `output` (of `world_size` times as many elements),
    /// rank `r`'s at offset `r * input.numel()`.
    fn all_gather(&self, input: &Tensor, output: &Tensor) -> Result<()>;
    /// Combines `input` (of `world_size` times `output`'s elements) over ranks with `op` and
    /// writes the `rank`-th chunk of the result into `output`.
    fn reduce_scatter(&self, input: &Tensor, output: &Tensor, op: ReduceOp) -> Result<()>;
    /// Returns once every rank reached it.
    fn barrier(&self) -> Result<()>;
}
