//! The stream engine: each stream owns a worker thread that runs its queue in order; and the
//! primary context a stream belongs to, which holds its streams and its sticky error (the two
//! refer to each other, so they live in one file).
//!
//! Invariants:
//! - Items run one at a time, in the order they were queued, on the stream's own worker; the
//!   `n`-th item queued has sequence number `n` and is done exactly when `completed >= n`.
//! - A wait item only ever waits for items queued *before* it (on any stream), so waits form no
//!   cycle and every queue drains.
//! - Legacy default-stream semantics: work on a context's null stream first waits for everything
//!   already queued on the context's blocking streams, and work on a blocking stream first waits
//!   for everything already queued on the null stream; non-blocking streams wait for nothing.
//! - After a context's sticky error, queued work is dropped without running (a faulted GPU runs
//!   nothing), while waits and event records still complete, so no synchroniser hangs.
//! - A destroyed stream drains its queue, then its worker exits.
//! - A context's sticky error, once set, is never cleared.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use cudarc::driver::sys::{CUcontext, CUresult};

use super::errors::{from_raw, is_sticky};
use super::{log, StreamWork};

/// One queued item.
pub(crate) enum Item {
    /// Device work (a copy, a kernel, a library call); skipped after a sticky error.
    Work(StreamWork),
    /// Bookkeeping that always runs (waits, event records).
    Control(Box<dyn FnOnce() + Send + 'static>),
}

#[derive(Default)]
struct State {
    queue: VecDeque<Item>,
    enqueued: u64,
    completed: u64,
    error: Option<CUresult>,
    closing: bool,
}

/// A stream: its queue, its counters, and what it synchronises with.
pub(crate) struct Stream {
    /// The context the stream belongs to.
    pub(crate) ctx: &'static Context,
    /// The context's legacy null stream.
    pub(crate) legacy: bool,
    /// Synchronises with the legacy null stream (created without `CU_STREAM_NON_BLOCKING`).
    pub(crate) blocking: bool,
    /// The flags it was created with.
    pub(crate) flags: u32,
    /// Its priority (lower is higher, as CUDA's).
    pub(crate) priority: i32,
    state: Mutex<State>,
    cond: Condvar,
}

thread_local! {
    static RNG: Cell<u64> = const { Cell::new(0) };
}

/// A random delay of 50 µs to 2 ms (xorshift, seeded per worker thread).
fn random_delay() -> Duration {
    RNG.with(|rng| {
        let mut x = rng.get();
        if x == 0 {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64);
            x = t | 1;
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        rng.set(x);
        Duration::from_micros(50 + x % 1950)
    })
}

impl Stream {
    /// Creates a stream of `ctx` and starts its worker (the error says why it could not).
    pub(crate) fn spawn(
        ctx: &'static Context,
        handle: usize,
        legacy: bool,
        flags: u32,
        priority: i32,
        delay: bool,
    ) -> Result<Arc<Stream>, String> {
        let stream = Arc::new(Stream {
            ctx,
            legacy,
            blocking: flags & 1 == 0,
            flags,
            priority,
            state: Mutex::new(State::default()),
            cond: Condvar::new(),
        });
        let worker = stream.clone();
        let name = format!("kiln-emu-stream-{handle:x}");
        std::thread::Builder::new()
            .name(name)
            .spawn(move || worker.run(delay))
            .map_err(|e| format!("cannot start a stream worker: {e}"))?;
        Ok(stream)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn run(self: Arc<Self>, delay: bool) {
        loop {
            let item = {
                let mut st = self.lock();
                loop {
                    if let Some(item) = st.queue.pop_front() {
                        break item;
                    }
                    if st.closing {
                        return;
                    }
                    st = self.cond.wait(st).unwrap_or_else(|e| e.into_inner());
                }
            };
            if delay {
                std::thread::sleep(random_delay());
            }
            let failed = match item {
                Item::Work(work) if self.ctx.sticky().is_none() => work().err(),
                Item::Work(_) => None,
                Item::Control(control) => {
                    control();
                    None
                }
            };
            if let Some(code) = failed {
                if is_sticky(code) {
                    self.ctx.set_sticky(code);
                }
            }
            let mut st = self.lock();
            if let Some(code) = failed.filter(|&c| !is_sticky(c)) {
                st.error.get_or_insert(code);
            }
            st.completed += 1;
            self.cond.notify_all();
        }
    }

    /// Queues `item` with no implicit dependency; returns its sequence number.
    pub(crate) fn push(&self, item: Item) -> u64 {
        let mut st = self.lock();
        st.queue.push_back(item);
        st.enqueued += 1;
        self.cond.notify_all();
        st.enqueued
    }

    /// Queues `item` after the implicit legacy-stream dependencies; returns its sequence number.
    pub(crate) fn submit(self: &Arc<Self>, item: Item) -> u64 {
        let others = if self.legacy {
            self.ctx.blocking_streams()
        } else if self.blocking {
            self.ctx.null_stream().into_iter().collect()
        } else {
            Vec::new()
        };
        for other in others {
            self.wait_on(&other, other.enqueued());
        }
        self.push(item)
    }

    /// Makes later work on `self` wait until `other` completed item `seq`.
    pub(crate) fn wait_on(&self, other: &Arc<Stream>, seq: u64) {
        if std::ptr::eq(self, Arc::as_ptr(other)) || other.is_done(seq) {
            return;
        }
        let other = other.clone();
        self.push(Item::Control(Box::new(move || other.wait_for(seq))));
    }

    /// Items queued so far.
    pub(crate) fn enqueued(&self) -> u64 {
        self.lock().enqueued
    }

    /// True when item `seq` has run.
    pub(crate) fn is_done(&self, seq: u64) -> bool {
        self.lock().completed >= seq
    }

    /// True when everything queued has run.
    pub(crate) fn is_idle(&self) -> bool {
        let st = self.lock();
        st.completed >= st.enqueued
    }

    /// Blocks until item `seq` has run.
    pub(crate) fn wait_for(&self, seq: u64) {
        let mut st = self.lock();
        while st.completed < seq {
            st = self.cond.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Blocks until everything queued so far has run; returns the context's sticky error, else
    /// the stream's first error since the last synchronisation (and clears it).
    pub(crate) fn synchronize(&self) -> Result<(), CUresult> {
        let target = self.enqueued();
        self.wait_for(target);
        if let Some(code) = self.ctx.sticky() {
            return Err(code);
        }
        match self.lock().error.take() {
            Some(code) => Err(code),
            None => Ok(()),
        }
    }

    /// Lets the worker exit once the queue is drained.
    pub(crate) fn close(&self) {
        self.lock().closing = true;
        self.cond.notify_all();
    }
}

/// A primary context.
pub(crate) struct Context {
    /// Its device's driver ordinal.
    pub(crate) device: i32,
    /// How many `cuDevicePrimaryCtxRetain`s are outstanding.
    pub(super) retains: AtomicU32,
    /// The flags set with `cuDevicePrimaryCtxSetFlags` / `cuCtxSetFlags`.
    pub(super) flags: AtomicU32,
    sticky: AtomicU32,
    /// `KILN_EMU_DELAY` as read at `cuInit` (for the null stream's worker).
    delay: bool,
    null: OnceLock<Result<Arc<Stream>, String>>,
    streams: Mutex<Vec<Weak<Stream>>>,
}

impl Context {
    /// A fresh context of driver ordinal `device` (no retains, flags or sticky error; its null
    /// stream starts on first use, delayed when `delay`).
    pub(super) fn new(device: i32, delay: bool) -> Context {
        Context {
            device,
            retains: AtomicU32::new(0),
            flags: AtomicU32::new(0),
            sticky: AtomicU32::new(0),
            delay,
            null: OnceLock::new(),
            streams: Mutex::new(Vec::new()),
        }
    }

    /// The `CUcontext` handle of this context.
    pub(crate) fn handle(&'static self) -> CUcontext {
        self as *const Context as CUcontext
    }

    /// The sticky error, if the context has faulted.
    pub(crate) fn sticky(&self) -> Option<CUresult> {
        match self.sticky.load(Ordering::SeqCst) {
            0 => None,
            raw => from_raw(raw),
        }
    }

    /// Ok, or the sticky error.
    pub(crate) fn check(&self) -> Result<(), CUresult> {
        self.sticky().map_or(Ok(()), Err)
    }

    /// Records a fault: the context is unusable from now on.
    pub(crate) fn set_sticky(&self, code: CUresult) {
        let first = self
            .sticky
            .compare_exchange(0, code as u32, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
        if first {
            log(&format!(
                "device {}: {code:?} is sticky: every later call on this context fails with it",
                self.device
            ));
        }
    }

    /// The context's legacy null stream (its worker starts on first use; if it cannot start,
    /// every use of the null stream fails with `CUDA_ERROR_OUT_OF_MEMORY`, logged once).
    pub(crate) fn null_stream(&'static self) -> Result<Arc<Stream>, CUresult> {
        let made = self
            .null
            .get_or_init(|| Stream::spawn(self, 0, true, 0, 0, self.delay).inspect_err(|e| log(e)));
        made.clone().map_err(|_| CUresult::CUDA_ERROR_OUT_OF_MEMORY)
    }

    /// Adds a created stream to the context's list.
    pub(crate) fn add_stream(&self, stream: &Arc<Stream>) {
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        streams.retain(|w| w.strong_count() > 0);
        streams.push(Arc::downgrade(stream));
    }

    /// Removes a destroyed stream from the context's list.
    pub(crate) fn remove_stream(&self, stream: &Arc<Stream>) {
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        streams.retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), Arc::as_ptr(stream)));
    }

    /// The context's live created streams.
    pub(crate) fn streams(&self) -> Vec<Arc<Stream>> {
        let streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        streams.iter().filter_map(Weak::upgrade).collect()
    }

    /// The created streams that synchronise with the null stream.
    pub(crate) fn blocking_streams(&self) -> Vec<Arc<Stream>> {
        self.streams().into_iter().filter(|s| s.blocking).collect()
    }

    /// Waits for every stream of the context; the sticky error, else the first stream error.
    pub(crate) fn synchronize(&'static self) -> Result<(), CUresult> {
        let mut first = None;
        let mut all = self.streams();
        all.extend(self.null_stream());
        for s in all {
            if let Err(code) = s.synchronize() {
                first.get_or_insert(code);
            }
        }
        self.check()?;
        first.map_or(Ok(()), Err)
    }
}
