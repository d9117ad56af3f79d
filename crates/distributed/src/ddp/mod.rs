//! [`DistributedDataParallel`]: PyTorch's DDP over a [`ProcessGroup`].
//!
//! Invariants:
//! - At construction every parameter and buffer (state-dict order) is broadcast from rank 0, so
//!   all ranks start from rank 0's model; then every parameter that requires grad gets a
//!   post-accumulate-grad hook, and those parameters are bucketed (`bucket`).
//! - A forward with grad mode on and outside [`DistributedDataParallel::no_sync`] starts a synced
//!   iteration: buffers are re-broadcast from rank 0 first (when `broadcast_buffers`, PyTorch's
//!   default), and the next backward's hooks launch each bucket's all-reduce as soon as its last
//!   gradient is accumulated, while backward goes on. [`DistributedDataParallel::finish`] (after
//!   backward, before the optimizer) waits them and writes the averaged gradients back into each
//!   parameter's `.grad()` in place. A forward inside `no_sync` only accumulates locally; the
//!   next synced backward reduces the accumulated sum.
//! - Every rank runs the same model with the same parameters in the same order, so the buckets
//!   and the order of collectives are identical on every rank.

mod bucket;
mod reducer;

pub use bucket::{assign_buckets, Bucket};
pub use reducer::SyncStats;

use crate::{Error, ProcessGroup, Result};
use kiln_autograd::{is_grad_enabled, no_grad, HookHandle, Parameter, Tensor};
use kiln_models::{Layer, LayerExt};
use reducer::Reducer;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// DDP's options (PyTorch's names and defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DdpOptions {
    /// Bucket size in MiB (default 25).
    pub bucket_cap_mb: f64,
    /// Re-broadcast buffers (BatchNorm's running statistics) from rank 0 at each synced forward
    /// (default true). Off: every rank keeps its own statistics (BatchNorm per process).
    pub broadcast_buffers: bool,
    /// Reduce parameters that got no gradient in a backward as zeros instead of failing
    /// (default false, which names them in an error); a parameter no rank has a gradient for
    /// keeps `.grad()` at `None`, as in PyTorch.
    pub find_unused_parameters: bool,
}

impl Default for DdpOptions {
    fn default() -> Self {
        DdpOptions {
            bucket_cap_mb: 25.0,
            broadcast_buffers: true,
            find_unused_parameters: false,
        }
    }
}

impl DdpOptions {
    /// Sets the bucket size in MiB.
    pub fn bucket_cap_mb(mut self, mb: f64) -> Self {
        self.bucket_cap_mb = mb;
        self
    }
    /// Sets whether buffers are re-broadcast from rank 0 at each synced forward.
    pub fn broadcast_buffers(mut self, on: bool) -> Self {
        self.broadcast_buffers = on;
        self
    }
    /// Sets whether parameters without a gradient are reduced as zeros instead of an error.
    pub fn find_unused_parameters(mut self, on: bool) -> Self {
        self.find_unused_parameters = on;
        self
    }
}

/// A model whose gradients are averaged over the ranks of a process group.
pub struct DistributedDataParallel<L: Layer> {
    module: L,
    group: Arc<dyn ProcessGroup>,
    options: DdpOptions,
    reducer: Arc<Mutex<Reducer>>,
    no_sync_depth: AtomicUsize,
    _hooks: Hooks,
}

fn lock(reducer: &Mutex<Reducer>) -> MutexGuard<'_, Reducer> {
    reducer.lock().unwrap_or_else(|p| p.into_inner())
}

impl<L: Layer> DistributedDataParallel<L> {
    /// Wraps `module`: broadcasts its parameters and buffers from rank 0, buckets the
    /// parameters that require grad and registers their hooks. Every rank must call it with the
    /// same architecture.
    pub fn new(module: L, group: Arc<dyn ProcessGroup>, options: DdpOptions) -> Result<Self> {
        let rank = group.rank();
        if !(options.bucket_cap_mb.is_finite() && options.bucket_cap_mb > 0.0) {
            return Err(Error::InvalidArgument {
                op: "DistributedDataParallel::new",
                msg: format!(
                    "bucket_cap_mb is {:?}; pass a positive size in MiB (PyTorch's default is 25)",
                    options.bucket_cap_mb
                ),
            });
        }
        for (_, t) in module.state_dict() {
            broadcast_in_place(group.as_ref(), &t)?;
        }
        let trainable: Vec<(String, Parameter)> = module
            .named_parameters()
            .into_iter()
            .filter(|(_, p)| p.requires_grad())
            .collect();
        let cap_bytes = (options.bucket_cap_mb * 1024.0 * 1024.0) as usize;
        let params: Vec<Parameter> = trainable.iter().map(|(_, p)| p.clone()).collect();
        let buckets = assign_buckets(&params, cap_bytes.max(1));
        let reducer = Arc::new(Mutex::new(Reducer::new(
            group.clone(),
            trainable,
            buckets,
            options.find_unused_parameters,
        )));
        let mut hooks = Vec::with_capacity(params.len());
        for (index, p) in params.iter().enumerate() {
            let shared = Arc::downgrade(&reducer);
            let handle = p.register_post_accumulate_grad_hook(move |_| {
                let Some(reducer) = shared.upgrade() else {
                    return Ok(());
                };
                let mut r = lock(&reducer);
                r.mark_ready(index).map_err(|e| r.fail(e))
            });
            match handle {
                Ok(h) => hooks.push(h),
                Err(e) => {
                    hooks.into_iter().for_each(HookHandle::remove);
                    return Err(Error::Ddp {
                        rank,
                        msg: format!("registering the gradient hooks failed: {e}"),
                    });
                }
            }
        }
        Ok(DistributedDataParallel {
            module,
            group,
            options,
            reducer,
            no_sync_depth: AtomicUsize::new(0),
            _hooks: Hooks(hooks),
        })
    }

    /// Runs the model. With grad mode on and outside [`Self::no_sync`], this starts a synced
    /// iteration: buffers come from rank 0 first (with `broadcast_buffers`), and the next
    /// backward all-reduces the gradients; call [`Self::finish`] after it.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let sync = is_grad_enabled() && !self.no_sync_active();
        if sync {
            if self.options.broadcast_buffers && self.group.world_size() > 1 {
                for (_, b) in self.module.named_buffers() {
                    broadcast_in_place(self.group.as_ref(), &b)?;
                }
            }
            lock(&self.reducer).prepare()?;
        }
        Ok(self.module.forward(x)?)
    }

    /// Waits for the gradient all-reduces of the last synced backward and writes the averaged
    /// gradients into every parameter's `.grad()`; call it after backward and before clipping
    /// or the optimizer step. Does nothing after a `no_sync` forward. Fails naming the
    /// parameters that got no gradient (unless `find_unused_parameters`), or with the first
    /// collective's error (naming the rank).
    pub fn finish(&self) -> Result<()> {
        lock(&self.reducer).finish()
    }

    /// `loss.backward()` then [`Self::finish`].
    pub fn backward(&self, loss: &Tensor) -> Result<()> {
        let result = loss.backward();
        let finished = self.finish();
        match (result, finished) {
            // A hook's own error is the typed one `finish` returns.
            (Err(_), Err(e)) | (Ok(()), Err(e)) => Err(e),
            (Err(e), Ok(())) => Err(e.into()),
            (Ok(()), Ok(())) => Ok(()),
        }
    }

    /// Turns gradient synchronisation off until the guard is dropped (PyTorch's `no_sync()`):
    /// forwards run inside only accumulate gradients locally, and the first synced forward and
    /// backward after it reduce the accumulated sum.
    pub fn no_sync(&self) -> NoSyncGuard<'_, L> {
        self.set_no_sync(true);
        NoSyncGuard { ddp: self }
    }

    fn set_no_sync(&self, on: bool) {
        if on {
            self.no_sync_depth.fetch_add(1, Ordering::AcqRel);
        } else {
            self.no_sync_depth.fetch_sub(1, Ordering::AcqRel);
        }
    }

    fn no_sync_active(&self) -> bool {
        self.no_sync_depth.load(Ordering::Acquire) > 0
    }

    /// The wrapped model.
    pub fn module(&self) -> &L {
        &self.module
    }

    /// The wrapped model, mutable (for `train` / `eval`).
    pub fn module_mut(&mut self) -> &mut L {
        &mut self.module
    }

    /// The process group.
    pub fn group(&self) -> &Arc<dyn ProcessGroup> {
        &self.group
    }

    /// The options.
    pub fn options(&self) -> DdpOptions {
        self.options
    }

    /// The buckets, in the order they are all-reduced.
    pub fn buckets(&self) -> Vec<Bucket> {
        lock(&self.reducer).buckets.clone()
    }

    /// The names of the bucketed parameters (those that require grad), in registration order;
    /// a bucket's `params` index this list.
    pub fn bucketed_names(&self) -> Vec<String> {
        lock(&self.reducer).names.clone()
    }

    /// What the last synced iteration did (buckets, all-reduces started during backward,
    /// exposed wait).
    pub fn last_stats(&self) -> SyncStats {
        lock(&self.reducer).last_stats.clone()
    }

    /// Removes the hooks and returns the model.
    pub fn into_inner(self) -> L {
        self.module
    }
}

/// The hooks of one DDP instance, removed when it is dropped.
struct Hooks(Vec<HookHandle>);

impl Drop for Hooks {
    fn drop(&mut self) {
        self.0.drain(..).for_each(HookHandle::remove);
    }
}

/// Ends a [`DistributedDataParallel::no_sync`] scope when dropped.
#[must_use = "synchronisation is back on as soon as the guard is dropped"]
pub struct NoSyncGuard<'a, L: Layer> {
    ddp: &'a DistributedDataParallel<L>,
}

impl<L: Layer> Drop for NoSyncGuard<'_, L> {
    fn drop(&mut self) {
        self.ddp.set_no_sync(false);
    }
}

/// Overwrites `t` with rank 0's values (parameters and buffers are leaves; no graph records).
fn broadcast_in_place(group: &dyn ProcessGroup, t: &Tensor) -> Result<()> {
    no_grad(|| group.broadcast(t, 0))
}
