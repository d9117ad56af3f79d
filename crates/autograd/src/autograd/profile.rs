//! Where the backward pass spends its time, by graph node (issue 16: a step that stops
//! scaling with threads shows it in its backward first).
//!
//! While a [`BackwardProfile`] records, the engine times every node it runs under the node's
//! name (`ConvolutionBackward`, `MmBackward`, ...), every sum of gradients arriving along
//! several paths under [`BackwardProfile::GRADIENT_SUM`], and every leaf's final accumulation
//! into `.grad()` (with the leaf's hooks) under [`BackwardProfile::ACCUMULATE_GRAD`];
//! [`BackwardProfile::finish`] returns the totals, slowest first. What the engine does besides
//! (its bookkeeping) is the backward's wall time less their sum.
//!
//! Invariants: while nothing records, the engine pays one relaxed atomic load per node and per
//! sum; the profile is process-wide (a backward on any thread counts) and at most one records at
//! a time; times are host wall time, so on CUDA, whose kernels run asynchronously, they are
//! launch time unless something waits.

use crate::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static RECORDING: AtomicBool = AtomicBool::new(false);
/// Totals by node name: few distinct names, so a list searched by name.
static TOTALS: Mutex<Vec<(&'static str, u64, Duration)>> = Mutex::new(Vec::new());

/// The time one kind of node took during a profile.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeTime {
    /// The node's name (`ConvolutionBackward`), or one of the engine's own
    /// ([`BackwardProfile::GRADIENT_SUM`], [`BackwardProfile::ACCUMULATE_GRAD`]).
    pub name: &'static str,
    /// How many times it ran.
    pub calls: u64,
    /// Its total wall time.
    pub seconds: f64,
}

/// A recording of backward node times (see the module doc); stops when finished or dropped.
#[derive(Debug)]
#[must_use = "the profile records until it is finished or dropped"]
pub struct BackwardProfile {
    _recording: (),
}

impl BackwardProfile {
    /// The name under which the sums of gradients arriving along several paths are recorded.
    pub const GRADIENT_SUM: &'static str = "GradientSum";
    /// The name under which leaves' accumulations into `.grad()` are recorded (PyTorch's node
    /// of that name).
    pub const ACCUMULATE_GRAD: &'static str = "AccumulateGrad";

    /// Starts recording. An error if another profile is recording.
    pub fn start() -> Result<Self> {
        if RECORDING
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return Err(Error::Autograd(
                "BackwardProfile::start: a profile is already recording; finish (or drop) it \
                 first"
                    .into(),
            ));
        }
        totals().clear();
        Ok(Self { _recording: () })
    }

    /// Stops recording and returns each node name's calls and time, slowest first (ties by
    /// name).
    pub fn finish(self) -> Vec<NodeTime> {
        let mut times: Vec<NodeTime> = totals()
            .drain(..)
            .map(|(name, calls, time)| NodeTime {
                name,
                calls,
                seconds: time.as_secs_f64(),
            })
            .collect();
        times.sort_by(|a, b| b.seconds.total_cmp(&a.seconds).then(a.name.cmp(b.name)));
        times
    }
}

impl Drop for BackwardProfile {
    fn drop(&mut self) {
        totals().clear();
        RECORDING.store(false, Ordering::Release);
    }
}

fn totals() -> std::sync::MutexGuard<'static, Vec<(&'static str, u64, Duration)>> {
    // The list is only ever left whole (no code that can panic runs under the lock).
    TOTALS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f`, adding its time to `name`'s total while a profile records.
#[inline]
pub(crate) fn timed<R>(name: &'static str, f: impl FnOnce() -> R) -> R {
    if !RECORDING.load(Ordering::Relaxed) {
        return f();
    }
    let start = Instant::now();
    let result = f();
    let elapsed = start.elapsed();
    let mut totals = totals();
    match totals.iter_mut().find(|(n, _, _)| *n == name) {
        Some((_, calls, time)) => {
            *calls += 1;
            *time += elapsed;
        }
        None => totals.push((name, 1, elapsed)),
    }
    result
}
