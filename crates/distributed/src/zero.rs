//! ZeRO stage 1: optimizer state sharded across ranks (PyTorch's `ZeroRedundancyOptimizer`).
//!
//! Invariants:
//! - Every parameter has exactly one owner rank. The partition is greedy by size and the same on
//!   every rank: parameters in decreasing element count (ties in list order), each to the rank
//!   owning the fewest elements so far (ties to the lowest rank).
//! - Each rank builds one kiln-optim optimizer over the parameters it owns, so it holds the
//!   state (moments, momentum buffers) of its shard only.
//! - [`ZeroRedundancyOptimizer::step`] steps the local optimizer (the owned parameters, from the
//!   gradients every rank holds after DDP's all-reduce), then broadcasts every parameter from
//!   its owner, in list order, so all ranks end the step with identical parameters. The
//!   per-element arithmetic of the update is the unsharded optimizer's, so a sharded run equals
//!   an unsharded one bit for bit.

use crate::{Error, ProcessGroup, Result};
use kiln_autograd::{no_grad, Parameter};
use kiln_optim::Optimizer;
use std::sync::Arc;

/// An optimizer whose state is split across the ranks of a group.
pub struct ZeroRedundancyOptimizer {
    group: Arc<dyn ProcessGroup>,
    params: Vec<(String, Parameter)>,
    owner: Vec<usize>,
    local: Box<dyn Optimizer>,
}

/// Owner rank of each of `numels` (greedy by size, see the module's invariants).
pub fn partition(numels: &[usize], world_size: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..numels.len()).collect();
    order.sort_by(|&a, &b| numels[b].cmp(&numels[a]).then(a.cmp(&b)));
    let mut load = vec![0usize; world_size.max(1)];
    let mut owner = vec![0; numels.len()];
    for i in order {
        let rank = (0..load.len())
            .min_by_key(|&r| (load[r], r))
            .expect("at least one rank");
        load[rank] = load[rank].saturating_add(numels[i]);
        owner[i] = rank;
    }
    owner
}

impl ZeroRedundancyOptimizer {
    /// Shards `params` over `group`'s ranks and builds this rank's optimizer with `make`, which
    /// gets the owned parameters (in list order), e.g.
    /// `|p| Ok(Box::new(AdamW::new(vec![ParamGroup::new(p)], AdamOptions::adamw())?))`.
    /// Every rank must pass the same parameter list.
    pub fn new(
        params: Vec<(String, Parameter)>,
        group: Arc<dyn ProcessGroup>,
        make: impl FnOnce(Vec<(String, Parameter)>) -> kiln_optim::Result<Box<dyn Optimizer>>,
    ) -> Result<Self> {
        let numels: Vec<usize> = params.iter().map(|(_, p)| p.numel()).collect();
        let owner = partition(&numels, group.world_size());
        let rank = group.rank();
        let mine: Vec<(String, Parameter)> = params
            .iter()
            .zip(&owner)
            .filter(|(_, &o)| o == rank)
            .map(|(p, _)| p.clone())
            .collect();
        let local = make(mine)?;
        Ok(ZeroRedundancyOptimizer {
            group,
            params,
            owner,
            local,
        })
    }

    /// Steps the owned parameters, then broadcasts every parameter from its owner.
    pub fn step(&mut self) -> Result<()> {
        self.local.step()?;
        for ((_, p), &owner) in self.params.iter().zip(&self.owner) {
            no_grad(|| self.group.broadcast(p, owner))?;
        }
        Ok(())
    }

    /// Clears the gradients of every parameter (not only the owned ones).
    pub fn zero_grad(&mut self, set_to_none: bool) -> Result<()> {
        for (_, p) in &self.params {
            if set_to_none {
                p.set_grad(None)?;
            } else if let Some(g) = p.grad() {
                no_grad(|| g.zero_())?;
            }
        }
        Ok(())
    }

    /// The owner rank of each parameter, in list order.
    pub fn owners(&self) -> &[usize] {
        &self.owner
    }

    /// The names of the parameters this rank owns.
    pub fn owned_names(&self) -> Vec<String> {
        self.local
            .named_params()
            .into_iter()
            .map(|(n, _)| n)
            .collect()
    }

    /// This rank's optimizer (over its shard).
    pub fn local_optimizer(&mut self) -> &mut dyn Optimizer {
        self.local.as_mut()
    }

    /// Bytes of optimizer state this rank holds (its moment and momentum buffers).
    pub fn state_bytes(&self) -> Result<usize> {
        optimizer_state_bytes(self.local.as_ref())
    }
}

/// Bytes of the state tensors of `optimizer` (from its state dict).
pub fn optimizer_state_bytes(optimizer: &dyn Optimizer) -> Result<usize> {
    let state = optimizer.state_dict()?;
    let mut total = 0usize;
    for record in state.state.iter().flatten() {
        for t in record.buffers.values() {
            let size = match t.dtype.as_str() {
                "float64" | "int64" => 8,
                "float32" => 4,
                "float16" | "bfloat16" => 2,
                "uint8" | "bool" => 1,
                other => {
                    return Err(Error::InvalidArgument {
                        op: "optimizer_state_bytes",
                        msg: format!("a state tensor has dtype {other}, which has no known size"),
                    })
                }
            };
            let n: usize = t.shape.iter().product();
            total = total.saturating_add(n.saturating_mul(size));
        }
    }
    Ok(total)
}

/// The memory plan's optimizer state under ZeRO-1 on `world_size` ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Zero1Saving {
    /// Optimizer state per rank without sharding (the plan's figure).
    pub unsharded_state_bytes: usize,
    /// Optimizer state per rank with ZeRO-1 (the largest shard, about the total / world size).
    pub sharded_state_bytes: usize,
    /// Fixed bytes per rank (parameters, buffers, gradients, state) with ZeRO-1.
    pub fixed_bytes: usize,
}

/// What ZeRO-1 saves per rank on a [`kiln_models::MemoryPlan`]: its optimizer state spread over
/// `world_size` ranks as [`partition`] spreads `param_numels` (the trainable parameters' element
/// counts, in order), the rest of the fixed bytes unchanged.
pub fn zero1_saving(
    plan: &kiln_models::MemoryPlan,
    param_numels: &[usize],
    world_size: usize,
) -> Zero1Saving {
    let owner = partition(param_numels, world_size);
    let total: usize = param_numels.iter().sum();
    let largest = (0..world_size.max(1))
        .map(|r| {
            owner
                .iter()
                .zip(param_numels)
                .filter(|(&o, _)| o == r)
                .map(|(_, &n)| n)
                .sum::<usize>()
        })
        .max()
        .unwrap_or(0);
    let unsharded = plan.optimizer_state_bytes;
    let sharded = if total == 0 {
        0
    } else {
        (unsharded as f64 * largest as f64 / total as f64).ceil() as usize
    };
    Zero1Saving {
        unsharded_state_bytes: unsharded,
        sharded_state_bytes: sharded,
        fixed_bytes: plan
            .fixed_bytes()
            .saturating_sub(unsharded)
            .saturating_add(sharded),
    }
}
