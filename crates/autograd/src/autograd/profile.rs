//! Where a step spends its time, op by op (issue 16: a step that stops scaling with threads
//! shows it op by op; on CUDA, which ops make a training step slower than PyTorch's).
//!
//! While an [`OpProfile`] records:
//! - every forward op is timed under its name (its node's name without `Backward`:
//!   `Convolution`, `Mm`, ...), by *self time*: an op that runs other ops inside it (autocast's
//!   casts of its operands, a composite op) keeps only its own share and the inner ops are
//!   counted under their own names; an op that runs itself again (autocast re-running it on the
//!   cast operands) counts once;
//! - every backward node is timed under its node's name (`ConvolutionBackward`), including
//!   whatever ops it runs inside; every sum of gradients arriving along several paths under
//!   [`OpProfile::GRADIENT_SUM`], and every leaf's final accumulation into `.grad()` (with the
//!   leaf's hooks) under [`OpProfile::ACCUMULATE_GRAD`].
//!
//! [`OpProfile::finish`] returns both lists, slowest first. What the engine does besides in a
//! backward (its bookkeeping) is the backward's wall time less the backward list's sum.
//!
//! Invariants: while nothing records, each op and node pays one relaxed atomic load; the
//! profile is process-wide (ops and backwards on any thread count) and at most one records at a
//! time; an op still running when its profile finishes is not counted in any profile. Times are
//! host wall time, so on CUDA, whose kernels run asynchronously, they are launch times, unless
//! the profile was started with [`OpProfile::start_synchronized`]: it then waits for the
//! device's queued work ([`kiln_device::wait_idle`]) at the start and end of every timed op and
//! node, so each time is the device's time for that op plus one wait, at the cost of a serialised
//! stream. The waits leave deferred index checks to the program's own next `synchronize`.

use crate::{Device, Error, Result};
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static RECORDING: AtomicBool = AtomicBool::new(false);
/// Which profile is recording (a new one per start): an op begun under another is not counted.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// What the recording profile has gathered: few distinct names, so lists searched by name.
struct Totals {
    forward: Vec<(&'static str, u64, Duration)>,
    backward: Vec<(&'static str, u64, Duration)>,
    /// The device waited for at each boundary (`start_synchronized`).
    wait_on: Option<Device>,
}

static TOTALS: Mutex<Totals> = Mutex::new(Totals {
    forward: Vec::new(),
    backward: Vec::new(),
    wait_on: None,
});

thread_local! {
    /// The forward ops being timed on this thread, innermost last.
    static FRAMES: RefCell<Vec<Frame>> = const { RefCell::new(Vec::new()) };
    /// How many backward sections this thread is inside (forward ops there are theirs).
    static IN_BACKWARD: Cell<u32> = const { Cell::new(0) };
}

/// A forward op being timed.
struct Frame {
    name: &'static str,
    generation: u64,
    start: Instant,
    /// Time spent in ops nested inside it.
    inner: Duration,
}

/// The time one kind of op or node took during a profile.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeTime {
    /// The forward op's name (`Convolution`), the backward node's (`ConvolutionBackward`), or
    /// one of the engine's own ([`OpProfile::GRADIENT_SUM`], [`OpProfile::ACCUMULATE_GRAD`]).
    pub name: &'static str,
    /// How many times it ran.
    pub calls: u64,
    /// Its total time (forward ops: self time, see the module doc).
    pub seconds: f64,
}

/// What an [`OpProfile`] recorded: forward ops and backward nodes, each slowest first (ties by
/// name).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OpTimes {
    /// Forward ops by name, self time.
    pub forward: Vec<NodeTime>,
    /// Backward nodes and the engine's sums and accumulations by name.
    pub backward: Vec<NodeTime>,
}

/// A recording of op and node times (see the module doc); stops when finished or dropped.
#[derive(Debug)]
#[must_use = "the profile records until it is finished or dropped"]
pub struct OpProfile {
    _recording: (),
}

impl OpProfile {
    /// The name under which the sums of gradients arriving along several paths are recorded.
    pub const GRADIENT_SUM: &'static str = "GradientSum";
    /// The name under which leaves' accumulations into `.grad()` are recorded (PyTorch's node
    /// of that name).
    pub const ACCUMULATE_GRAD: &'static str = "AccumulateGrad";

    /// Starts recording host wall times. An error if another profile is recording.
    pub fn start() -> Result<Self> {
        Self::begin(None)
    }

    /// Starts recording, waiting for `device`'s queued work at the start and end of every op
    /// and node, so that on CUDA each time is the device's (see the module doc). On the CPU it
    /// is [`OpProfile::start`]. An error if another profile is recording, or if `device` cannot
    /// be waited for (no CUDA, no such device: the error names it).
    pub fn start_synchronized(device: Device) -> Result<Self> {
        kiln_device::wait_idle(device)?;
        Self::begin(Some(device))
    }

    fn begin(wait_on: Option<Device>) -> Result<Self> {
        if RECORDING
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return Err(Error::Autograd(
                "OpProfile::start: a profile is already recording; finish (or drop) it first"
                    .into(),
            ));
        }
        GENERATION.fetch_add(1, Ordering::AcqRel);
        let mut totals = totals();
        totals.forward.clear();
        totals.backward.clear();
        totals.wait_on = wait_on;
        Ok(Self { _recording: () })
    }

    /// Stops recording and returns each name's calls and time.
    pub fn finish(self) -> OpTimes {
        let mut totals = totals();
        let sorted = |list: &mut Vec<(&'static str, u64, Duration)>| {
            let mut times: Vec<NodeTime> = list
                .drain(..)
                .map(|(name, calls, time)| NodeTime {
                    name,
                    calls,
                    seconds: time.as_secs_f64(),
                })
                .collect();
            times.sort_by(|a, b| b.seconds.total_cmp(&a.seconds).then(a.name.cmp(b.name)));
            times
        };
        OpTimes {
            forward: sorted(&mut totals.forward),
            backward: sorted(&mut totals.backward),
        }
    }
}

impl Drop for OpProfile {
    fn drop(&mut self) {
        let mut totals = totals();
        totals.forward.clear();
        totals.backward.clear();
        totals.wait_on = None;
        // Ends the generation too: an op begun under this profile is not counted in the next.
        GENERATION.fetch_add(1, Ordering::AcqRel);
        RECORDING.store(false, Ordering::Release);
    }
}

fn totals() -> std::sync::MutexGuard<'static, Totals> {
    // The lists are only ever left whole (no code that can panic runs under the lock).
    TOTALS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Waits for the synchronized profile's device, if any. A failed wait is not reported here: the
/// error is the device's and reaches the program at its next wait or copy.
fn wait() {
    let device = totals().wait_on;
    if let Some(device) = device {
        let _ = kiln_device::wait_idle(device);
    }
}

/// Adds `elapsed` to `name` in `list`, if profile `generation` is still the one recording.
fn add(generation: u64, backward: bool, name: &'static str, elapsed: Duration) {
    if !RECORDING.load(Ordering::Acquire) || GENERATION.load(Ordering::Acquire) != generation {
        return;
    }
    let mut totals = totals();
    let list = if backward {
        &mut totals.backward
    } else {
        &mut totals.forward
    };
    match list.iter_mut().find(|(n, _, _)| *n == name) {
        Some((_, calls, time)) => {
            *calls += 1;
            *time += elapsed;
        }
        None => list.push((name, 1, elapsed)),
    }
}

/// Runs backward section `f` (a node, a gradient sum, a leaf's accumulation), adding its time
/// to `name`'s total while a profile records.
#[inline]
pub(crate) fn timed<R>(name: &'static str, f: impl FnOnce() -> R) -> R {
    if !RECORDING.load(Ordering::Relaxed) {
        return f();
    }
    let generation = GENERATION.load(Ordering::Acquire);
    wait();
    let start = Instant::now();
    IN_BACKWARD.set(IN_BACKWARD.get() + 1);
    let result = f();
    IN_BACKWARD.set(IN_BACKWARD.get() - 1);
    wait();
    add(generation, true, name, start.elapsed());
    result
}

/// Times one forward op from its creation to its drop while a profile records (see
/// [`forward_timer`]).
pub(crate) struct ForwardTimer {
    timing: bool,
}

/// The timer of the forward op whose node is `node_name` (recorded under the name without
/// `Backward`): inactive while nothing records, inside a backward section, or directly inside
/// an op of the same name.
#[inline]
pub(crate) fn forward_timer(node_name: &'static str) -> ForwardTimer {
    if !RECORDING.load(Ordering::Relaxed) || IN_BACKWARD.get() > 0 {
        return ForwardTimer { timing: false };
    }
    let name = node_name.strip_suffix("Backward").unwrap_or(node_name);
    let generation = GENERATION.load(Ordering::Acquire);
    let again = FRAMES.with(|f| f.borrow().last().is_some_and(|top| top.name == name));
    if again {
        return ForwardTimer { timing: false };
    }
    wait();
    FRAMES.with(|f| {
        f.borrow_mut().push(Frame {
            name,
            generation,
            start: Instant::now(),
            inner: Duration::ZERO,
        })
    });
    ForwardTimer { timing: true }
}

impl Drop for ForwardTimer {
    fn drop(&mut self) {
        if !self.timing {
            return;
        }
        wait();
        let end = Instant::now();
        let popped = FRAMES.with(|f| {
            let mut frames = f.borrow_mut();
            let frame = frames.pop()?;
            let total = end.saturating_duration_since(frame.start);
            if let Some(parent) = frames.last_mut() {
                parent.inner += total;
            }
            Some((
                frame.generation,
                frame.name,
                total.saturating_sub(frame.inner),
            ))
        });
        if let Some((generation, name, own)) = popped {
            add(generation, false, name, own);
        }
    }
}
