//! A collective as the queued transports (MPI, NCCL) hand it to their communication thread:
//! its tensors ([`Op`]) and its [`Signature`], built by [`LocalChecks`] only after this rank's
//! own arguments passed every check.
//!
//! Invariants: a refused call still yields a pair ([`queued`]: the invalid signature and the
//! error), so the rank takes part in the signature exchange and its peers fail with it instead
//! of waiting; the checks and the signature of each collective are written once here, so both
//! transports refuse the same arguments with the same messages. Both transports also share
//! their communication thread's handle ([`CommThread`]: dropping it closes the queue, then
//! waits for the thread) and the collectives of their `ProcessGroup` impls
//! ([`queued_process_group`]).

use crate::signature::{check_avg, check_pair, check_root, Kind, Signature};
use crate::{Error, ReduceOp, Result};
use kiln_autograd::Tensor;
use std::sync::mpsc;
use std::thread::JoinHandle;

/// A collective with its tensors.
pub(crate) enum Op {
    AllReduce(Tensor, ReduceOp),
    Broadcast(Tensor, usize),
    AllGather(Tensor, Tensor),
    ReduceScatter(Tensor, Tensor, ReduceOp),
    Barrier,
    /// This rank refused its own arguments: take part in the signature exchange, then fail.
    Refused(Error),
}

impl Op {
    /// The tensors the collective reads or writes (kept alive by its work).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn tensors(&self) -> Vec<Tensor> {
        match self {
            Op::AllReduce(t, _) | Op::Broadcast(t, _) => vec![t.clone()],
            Op::AllGather(a, b) | Op::ReduceScatter(a, b, _) => vec![a.clone(), b.clone()],
            Op::Barrier | Op::Refused(_) => Vec::new(),
        }
    }
}

/// What a checked call queues: its signature and its tensors, or for refused arguments the
/// invalid signature and the error (see the module's invariants).
pub(crate) fn queued(checked: Result<(Signature, Op)>) -> (Signature, Op) {
    checked.unwrap_or_else(|e| (Signature::invalid(), Op::Refused(e)))
}

/// The local checks of one transport: the group's size and what that transport accepts of a
/// single tensor (device, dtype, layout), applied before every collective is built.
pub(crate) struct LocalChecks<F> {
    /// Ranks in the group.
    pub(crate) world_size: usize,
    /// Refuses a tensor this transport cannot carry, naming the collective.
    pub(crate) tensor: F,
}

impl<F: Fn(&'static str, &Tensor) -> Result<()>> LocalChecks<F> {
    /// `all_reduce` of `tensor` with `op`.
    pub(crate) fn all_reduce(&self, tensor: &Tensor, op: ReduceOp) -> Result<(Signature, Op)> {
        let name = "all_reduce";
        (self.tensor)(name, tensor)?;
        check_avg(name, tensor, op)?;
        let n = tensor.numel();
        let sig = Signature::new(Kind::AllReduce, tensor.dtype(), n, n).with_op(op);
        Ok((sig, Op::AllReduce(tensor.clone(), op)))
    }

    /// `broadcast` of `tensor` from rank `root`.
    pub(crate) fn broadcast(&self, tensor: &Tensor, root: usize) -> Result<(Signature, Op)> {
        let name = "broadcast";
        (self.tensor)(name, tensor)?;
        check_root(name, root, self.world_size)?;
        let n = tensor.numel();
        let sig = Signature::new(Kind::Broadcast, tensor.dtype(), n, n).with_root(root);
        Ok((sig, Op::Broadcast(tensor.clone(), root)))
    }

    /// `all_gather` of every rank's `input` into `output` (`world_size` times as long).
    pub(crate) fn all_gather(&self, input: &Tensor, output: &Tensor) -> Result<(Signature, Op)> {
        let name = "all_gather";
        (self.tensor)(name, input)?;
        (self.tensor)(name, output)?;
        check_pair(name, input, output, self.world_size)?;
        let sig = Signature::new(
            Kind::AllGather,
            input.dtype(),
            input.numel(),
            output.numel(),
        );
        Ok((sig, Op::AllGather(input.clone(), output.clone())))
    }

    /// `reduce_scatter` of `input` (`world_size` times as long as `output`) with `op`.
    pub(crate) fn reduce_scatter(
        &self,
        input: &Tensor,
        output: &Tensor,
        op: ReduceOp,
    ) -> Result<(Signature, Op)> {
        let name = "reduce_scatter";
        (self.tensor)(name, input)?;
        (self.tensor)(name, output)?;
        check_pair(name, output, input, self.world_size)?;
        check_avg(name, input, op)?;
        let sig = Signature::new(
            Kind::ReduceScatter,
            input.dtype(),
            input.numel(),
            output.numel(),
        )
        .with_op(op);
        Ok((sig, Op::ReduceScatter(input.clone(), output.clone(), op)))
    }

    /// `barrier`: nothing to check.
    pub(crate) fn barrier(&self) -> (Signature, Op) {
        (Signature::barrier(), Op::Barrier)
    }
}

/// A transport's communication thread and the queue of jobs it serves, in order.
///
/// Dropping it closes the queue, so the thread stops once it has finished the jobs already
/// queued (and releases what it owns), and waits for it. A group holds it as its first field,
/// so this happens before the rest of the group is dropped.
pub(crate) struct CommThread<J> {
    jobs: Option<mpsc::Sender<J>>,
    thread: Option<JoinHandle<()>>,
}

impl<J> CommThread<J> {
    /// The handle on `thread`, which serves the jobs sent into `jobs`.
    pub(crate) fn new(jobs: mpsc::Sender<J>, thread: JoinHandle<()>) -> Self {
        CommThread {
            jobs: Some(jobs),
            thread: Some(thread),
        }
    }

    /// Queues `job`; `false` when the thread has stopped (it panicked or returned).
    pub(crate) fn send(&self, job: J) -> bool {
        self.jobs.as_ref().is_some_and(|tx| tx.send(job).is_ok())
    }
}

impl<J> Drop for CommThread<J> {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A queued transport's `ProcessGroup` impl, written once: the group's `rank`, `world_size` and
/// `local_rank` fields, its backend, and the collectives, each checked by the group's
/// `checks()` ([`LocalChecks`]), then queued by its `started(name, checked)`, which returns the
/// collective's work: handed back by `start_all_reduce`, waited for by the others.
macro_rules! queued_process_group {
    ($group:ty, $backend:expr) => {
        impl $crate::ProcessGroup for $group {
            fn rank(&self) -> usize {
                self.rank
            }

            fn world_size(&self) -> usize {
                self.world_size
            }

            fn local_rank(&self) -> usize {
                self.local_rank
            }

            fn backend(&self) -> $crate::BackendKind {
                $backend
            }

            fn start_all_reduce(
                &self,
                tensor: &::kiln_autograd::Tensor,
                op: $crate::ReduceOp,
            ) -> $crate::Result<Box<dyn $crate::PendingWork>> {
                let work = self.started("all_reduce", self.checks().all_reduce(tensor, op))?;
                Ok(Box::new(work))
            }

            fn broadcast(
                &self,
                tensor: &::kiln_autograd::Tensor,
                root: usize,
            ) -> $crate::Result<()> {
                let work = self.started("broadcast", self.checks().broadcast(tensor, root))?;
                $crate::PendingWork::wait(Box::new(work))
            }

            fn all_gather(
                &self,
                input: &::kiln_autograd::Tensor,
                output: &::kiln_autograd::Tensor,
            ) -> $crate::Result<()> {
                let work = self.started("all_gather", self.checks().all_gather(input, output))?;
                $crate::PendingWork::wait(Box::new(work))
            }

            fn reduce_scatter(
                &self,
                input: &::kiln_autograd::Tensor,
                output: &::kiln_autograd::Tensor,
                op: $crate::ReduceOp,
            ) -> $crate::Result<()> {
                let checked = self.checks().reduce_scatter(input, output, op);
                let work = self.started("reduce_scatter", checked)?;
                $crate::PendingWork::wait(Box::new(work))
            }

            fn barrier(&self) -> $crate::Result<()> {
                let work = self.started("barrier", Ok(self.checks().barrier()))?;
                $crate::PendingWork::wait(Box::new(work))
            }
        }
    };
}
pub(crate) use queued_process_group;
