//! A collective as the queued transports (MPI, NCCL) hand it to their communication thread:
//! its tensors ([`Op`]) and its [`Signature`], built by [`LocalChecks`] only after this rank's
//! own arguments passed every check.
//!
//! Invariants: a refused call still yields a pair ([`queued`]: the invalid signature and the
//! error), so the rank takes part in the signature exchange and its peers fail with it instead
//! of waiting; the checks and the signature of each collective are written once here, so both
//! transports refuse the same arguments with the same messages.

use crate::signature::{check_avg, check_pair, check_root, Kind, Signature};
use crate::{Error, ReduceOp, Result};
use kiln_autograd::Tensor;

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
