//! The reducer: the per-iteration state DDP's gradient hooks and `finish` share.
//!
//! Invariants:
//! - An iteration starts at a synced forward ([`Reducer::prepare`]) and ends at
//!   [`Reducer::finish`]. Between them each bucketed parameter is marked ready at most once,
//!   by its post-accumulate-grad hook, when backward accumulated its gradient.
//! - Buckets are launched strictly in bucket order (bucket `k` only after `0..k`), when all of
//!   their parameters are ready, so every rank issues the same all-reduces in the same order
//!   even when gradients become ready in a different order.
//! - Launching copies the bucket's gradients into one flat buffer and starts an asynchronous
//!   `ReduceOp::Avg` all-reduce on it; nothing reads or writes that buffer until `finish` waited
//!   for its work. `finish` waits the works in launch order and copies each parameter's slice
//!   of its averaged buffer back into the parameter's `.grad()` tensor in place, so gradient
//!   handles the caller holds stay valid.
//! - With `find_unused_parameters`, a parameter without a gradient is reduced as zeros, and
//!   `finish` sums over the ranks which parameters hold a gradient (one more all-reduce, after
//!   the buckets', on every rank): a parameter no rank has a gradient for keeps `.grad()` at
//!   `None`, as PyTorch leaves a globally unused parameter's gradient untouched (so an
//!   optimizer skips it: no weight decay, no moment decay); one another rank used gets the
//!   average.

use super::bucket::Bucket;
use crate::{Error, PendingWork, ProcessGroup, ReduceOp, Result};
use kiln_autograd::{no_grad, Parameter, Tensor};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the last synced iteration did, for tests and benchmarks.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SyncStats {
    /// Buckets all-reduced.
    pub buckets: usize,
    /// All-reduces started while backward still ran: before the last parameter's hook.
    pub started_before_last_hook: usize,
    /// Hooks that ran (parameters whose gradient backward produced).
    pub hooks: usize,
    /// Parameters that got no gradient on this rank and were reduced as zeros
    /// (`find_unused_parameters`); those no rank had a gradient for keep none.
    pub unused: Vec<String>,
    /// From the first hook to the last hook (the part of backward that produced gradients).
    pub hook_span: Duration,
    /// Time `finish` spent blocked waiting for all-reduces (the communication not hidden
    /// behind backward).
    pub exposed_wait: Duration,
    /// When each bucket's all-reduce was started, in bucket order.
    pub bucket_started_at: Vec<Instant>,
}

pub(crate) struct Reducer {
    pub(crate) group: Arc<dyn ProcessGroup>,
    pub(crate) names: Vec<String>,
    pub(crate) params: Vec<Parameter>,
    pub(crate) buckets: Vec<Bucket>,
    /// Bucket of each parameter.
    pub(crate) bucket_of: Vec<usize>,
    pub(crate) find_unused_parameters: bool,
    /// True between a synced forward and `finish`.
    pub(crate) expect_sync: bool,
    ready: Vec<bool>,
    pending: Vec<usize>,
    next_bucket: usize,
    launched: Vec<(Tensor, Box<dyn PendingWork>)>,
    /// Hooks seen at each launch, and when it happened.
    launched_at_hook: Vec<usize>,
    launched_at: Vec<Instant>,
    hooks: usize,
    first_hook: Option<Instant>,
    last_hook: Option<Instant>,
    /// The first error a hook met; `finish` returns it.
    failed: Option<Error>,
    pub(crate) last_stats: SyncStats,
}

impl Reducer {
    pub(crate) fn new(
        group: Arc<dyn ProcessGroup>,
        named: Vec<(String, Parameter)>,
        buckets: Vec<Bucket>,
        find_unused_parameters: bool,
    ) -> Self {
        let mut bucket_of = vec![0; named.len()];
        for (b, bucket) in buckets.iter().enumerate() {
            for &p in &bucket.params {
                bucket_of[p] = b;
            }
        }
        let (names, params) = named.into_iter().unzip();
        Reducer {
            group,
            names,
            params,
            buckets,
            bucket_of,
            find_unused_parameters,
            expect_sync: false,
            ready: Vec::new(),
            pending: Vec::new(),
            next_bucket: 0,
            launched: Vec::new(),
            launched_at_hook: Vec::new(),
            launched_at: Vec::new(),
            hooks: 0,
            first_hook: None,
            last_hook: None,
            failed: None,
            last_stats: SyncStats::default(),
        }
    }

    fn ddp_err(&self, msg: String) -> Error {
        Error::Ddp {
            rank: self.group.rank(),
            msg,
        }
    }

    /// Starts an iteration (a forward outside `no_sync` with grad mode on).
    pub(crate) fn prepare(&mut self) -> Result<()> {
        if self.expect_sync && self.hooks > 0 {
            return Err(self.ddp_err(
                "a forward started before the previous backward's gradients were synchronized; \
                 call finish() after every synced backward, before the optimizer step"
                    .into(),
            ));
        }
        self.expect_sync = true;
        self.ready = vec![false; self.params.len()];
        self.pending = self.buckets.iter().map(|b| b.params.len()).collect();
        self.next_bucket = 0;
        self.launched.clear();
        self.launched_at_hook.clear();
        self.launched_at.clear();
        self.hooks = 0;
        self.first_hook = None;
        self.last_hook = None;
        self.failed = None;
        Ok(())
    }

    /// The hook of parameter `index`: marks it ready and launches the buckets that can go.
    pub(crate) fn mark_ready(&mut self, index: usize) -> Result<()> {
        if !self.expect_sync {
            return Ok(()); // no_sync, or a backward without a DDP forward: local accumulation
        }
        if self.ready[index] {
            return Err(self.ddp_err(format!(
                "parameter {} got a second gradient in one iteration (a second backward before \
                 finish()); run each backward in its own iteration, or the extra ones under \
                 no_sync()",
                self.names[index]
            )));
        }
        let now = Instant::now();
        self.first_hook.get_or_insert(now);
        self.last_hook = Some(now);
        self.hooks += 1;
        self.ready[index] = true;
        let b = self.bucket_of[index];
        self.pending[b] -= 1;
        self.launch_ready_buckets()
    }

    fn launch_ready_buckets(&mut self) -> Result<()> {
        while self.next_bucket < self.buckets.len() && self.pending[self.next_bucket] == 0 {
            let b = self.next_bucket;
            let flat = self.flatten(b)?;
            let work = self.group.start_all_reduce(&flat, ReduceOp::Avg)?;
            self.launched.push((flat, work));
            self.launched_at_hook.push(self.hooks);
            self.launched_at.push(Instant::now());
            self.next_bucket += 1;
        }
        Ok(())
    }

    /// One flat copy of bucket `b`'s gradients (zeros for a parameter without one).
    fn flatten(&self, b: usize) -> Result<Tensor> {
        let parts = self.buckets[b]
            .params
            .iter()
            .map(|&p| {
                let param = &self.params[p];
                let grad = match param.grad() {
                    Some(g) => g,
                    None => param.detach().zeros_like()?,
                };
                grad.reshape(&[-1])
            })
            .collect::<kiln_autograd::Result<Vec<_>>>()?;
        Ok(no_grad(|| Tensor::cat(&parts, 0))?.contiguous()?)
    }

    /// Records a hook's error for `finish` and hands backward one of its own to stop it.
    pub(crate) fn fail(&mut self, err: Error) -> kiln_autograd::Error {
        let msg = err.to_string();
        self.failed.get_or_insert(err);
        kiln_autograd::Error::Autograd(msg)
    }

    /// Ends the iteration: reduces what is left, waits every work, writes the averages back.
    pub(crate) fn finish(&mut self) -> Result<()> {
        if !self.expect_sync {
            return Ok(());
        }
        self.expect_sync = false;
        if let Some(err) = self.failed.take() {
            self.drain();
            return Err(err);
        }
        if self.hooks == 0 {
            return Ok(()); // a forward without backward (evaluation with grad mode on)
        }
        let holds_grad: Vec<bool> = self.params.iter().map(|p| p.grad().is_some()).collect();
        let unused: Vec<usize> = (0..self.params.len()).filter(|&i| !self.ready[i]).collect();
        let unused_names: Vec<String> = unused.iter().map(|&i| self.names[i].clone()).collect();
        if !unused.is_empty() {
            if !self.find_unused_parameters {
                self.drain();
                return Err(self.ddp_err(format!(
                    "parameters that require grad got no gradient in this backward: {}; every \
                     such parameter must take part in the loss on every rank (freeze it with \
                     set_requires_grad(false) before wrapping), or build with \
                     DdpOptions::find_unused_parameters(true), which reduces them as zeros",
                    unused_names.join(", ")
                )));
            }
            for &i in &unused {
                self.ready[i] = true;
                self.pending[self.bucket_of[i]] -= 1;
            }
            self.launch_ready_buckets()?;
        }
        let hook_span = match (self.first_hook, self.last_hook) {
            (Some(a), Some(b)) => b - a,
            _ => Duration::ZERO,
        };
        let started_before_last_hook = self
            .launched_at_hook
            .iter()
            .filter(|&&h| h < self.hooks)
            .count();
        let wait_start = Instant::now();
        let launched = std::mem::take(&mut self.launched);
        let mut flats = Vec::with_capacity(launched.len());
        for (flat, work) in launched {
            work.wait()?;
            flats.push(flat);
        }
        let exposed_wait = wait_start.elapsed();
        let used_anywhere = match self.find_unused_parameters {
            true => self.used_on_any_rank(&holds_grad)?,
            false => vec![true; self.params.len()],
        };
        for (b, flat) in flats.iter().enumerate() {
            self.write_back(b, flat, &used_anywhere)?;
        }
        self.last_stats = SyncStats {
            buckets: flats.len(),
            started_before_last_hook,
            hooks: self.hooks,
            unused: unused_names,
            hook_span,
            exposed_wait,
            bucket_started_at: std::mem::take(&mut self.launched_at),
        };
        self.hooks = 0;
        Ok(())
    }

    /// Whether each parameter holds a gradient on at least one rank (`holds_grad` is this
    /// rank's answer); a collective, so every rank calls it at the same point.
    fn used_on_any_rank(&self, holds_grad: &[bool]) -> Result<Vec<bool>> {
        let Some(first) = self.params.first() else {
            return Ok(Vec::new());
        };
        let flags: Vec<f32> = holds_grad.iter().map(|&h| f32::from(u8::from(h))).collect();
        let counts = Tensor::from_vec(flags, &[holds_grad.len()], kiln_autograd::Device::Cpu)?
            .to_device(first.device())?;
        no_grad(|| self.group.all_reduce(&counts, ReduceOp::Sum))?;
        Ok(counts
            .to_vec::<f32>()?
            .into_iter()
            .map(|c| c > 0.0)
            .collect())
    }

    /// Copies bucket `b`'s averaged slices into its parameters' gradients, except into those
    /// that no rank has a gradient for (`used_anywhere` false), which stay `None`.
    fn write_back(&self, b: usize, flat: &Tensor, used_anywhere: &[bool]) -> Result<()> {
        let bucket = &self.buckets[b];
        no_grad(|| -> Result<()> {
            for (&p, &offset) in bucket.params.iter().zip(&bucket.offsets) {
                if !used_anywhere[p] {
                    continue;
                }
                let param = &self.params[p];
                let slice = flat
                    .narrow(0, offset, param.numel())?
                    .reshape_to(param.shape())?;
                match param.grad() {
                    Some(g) => g.copy_(&slice)?,
                    None => param.set_grad(Some(slice.contiguous()?.copy_data()?))?,
                }
            }
            Ok(())
        })
    }

    /// Waits the works in flight, ignoring their results (after an error, so no work is left
    /// writing into a buffer).
    fn drain(&mut self) {
        for (_, work) in self.launched.drain(..) {
            let _ = work.wait();
        }
        self.hooks = 0;
    }
}
