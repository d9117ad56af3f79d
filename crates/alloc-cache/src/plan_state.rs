//! The state of planned steps behind the allocator's lock (`planner.rs` holds the logic): what
//! is being recorded, and the plan being served. A leaf module, so the allocator's state can
//! hold it without the logic's dependencies.
//!
//! Invariants: `recording` holds events only while no plan is active, and allocations only of
//! the thread that marks the steps (or of a thread that entered its [`StepThread`]);
//! `Active::places` has one entry per request; `Active::live` holds exactly the planned blocks
//! and the lent blocks (`plan_lend.rs`) allocated or pending; `Active::lent` is the subset of
//! `live` that was lent.

use crate::backend::StreamId;
use crate::stats::PoolKind;
use crate::trace::{Trace, TraceEvent};
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// What planned steps did so far ([`crate::CachingAllocator::plan_counts`]) or what a
/// [`PlannedReplayer`](crate::planned::PlannedReplayer) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PlannedCounts {
    /// Steps served wholly from the plan (or arena).
    pub planned_steps: u64,
    /// Steps that deviated from the plan and finished through the caching allocator.
    pub fallback_steps: u64,
    /// Allocations served from the plan (or arena).
    pub arena_allocs: u64,
    /// Scratch blocks (allocated under [`StepThread::OUTSIDE`]) lent a stretch of a bin that
    /// no planned block held at the time, where the cache had no free block for them.
    pub lent_allocs: u64,
    /// Planned allocations the cache served because a lent block still held their place.
    pub displaced_allocs: u64,
}

/// The plan being served.
#[derive(Debug)]
pub(crate) struct Active {
    /// Requested bytes of each allocation of the step, in order.
    pub(crate) requests: Vec<usize>,
    /// The stream of every allocation of the step.
    pub(crate) stream: StreamId,
    /// Address and pool of each planned allocation; `None` for one the cache serves.
    pub(crate) places: Vec<Option<(u64, PoolKind)>>,
    /// The bins holding planned blocks (state `Arena`).
    pub(crate) bins: Vec<u32>,
    /// Index of the next allocation in the current step.
    pub(crate) next: usize,
    /// The current step left the plan.
    pub(crate) deviated: bool,
    /// The current step asked for more than the plan holds, past its last placed block (work
    /// the recorded step did not make, such as an evaluation after the loop's steps).
    pub(crate) beyond: bool,
    /// Dropped: no more placements; the bins go back once `live` is empty.
    pub(crate) dropped: bool,
    /// Planned and lent blocks live now: address -> end.
    pub(crate) live: BTreeMap<u64, u64>,
    /// The addresses in `live` of blocks lent to scratch (`plan_lend.rs`), not planned.
    pub(crate) lent: BTreeSet<u64>,
    /// The bin for the blocks no free block had room for, if any.
    pub(crate) spare: Option<Spare>,
    /// One past the index of the last allocation the plan places (0 when it places none): a
    /// step that got that far has used the whole plan.
    pub(crate) last_placed: usize,
}

/// Where a request that is not the plan's next one goes ([`Active::realign`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Realign {
    /// It is the plan's request at this index: the ones before it, all served by the cache
    /// (state the recorded step made, which this step does not), are skipped.
    At(usize),
    /// No block the plan placed is left in the step: the cache serves it and the plan goes on.
    Extra,
    /// A deviation.
    Deviate,
}

impl Active {
    /// Whether the plan leaves allocation `k` to the cache (it outlived the recorded step).
    pub(crate) fn cached(&self, k: usize) -> bool {
        self.places[k].is_none() && self.spare.as_ref().is_none_or(|s| s.offsets[k].is_none())
    }

    /// Whether the step under way has used the whole plan and left it intact: no deviation,
    /// every placed block asked for, none still live (lent blocks do not count). How a step is
    /// counted when the plan ends it (at a marker, or dropped between steps) as served rather
    /// than fallen back.
    pub(crate) fn served_whole(&self) -> bool {
        !self.deviated && self.next >= self.last_placed && self.live.len() == self.lent.len()
    }

    /// Counts the step under way in `counts` as the plan ends it: planned when it was served
    /// whole ([`served_whole`](Self::served_whole)), fallen back otherwise.
    pub(crate) fn count_step(&self, counts: &mut PlannedCounts) {
        if self.served_whole() {
            counts.planned_steps += 1;
        } else {
            counts.fallback_steps += 1;
        }
    }

    /// Whether a planned or lent block lives in the `bytes` from `addr` (a bin's range): the
    /// bin is busy, not idle.
    pub(crate) fn holds_live(&self, addr: u64, bytes: usize) -> bool {
        self.live.range(addr..addr + bytes as u64).next().is_some()
    }

    /// One past the index of the last allocation the plan places (0 when it places none).
    pub(crate) fn find_last_placed(&self) -> usize {
        (0..self.requests.len())
            .rev()
            .find(|&k| !self.cached(k))
            .map_or(0, |k| k + 1)
    }

    /// Where a request of `size` goes when allocation `i` of the plan asks for another size:
    /// at the first later allocation of that size when only allocations the cache serves lie
    /// between (the recorded step made them and this step does not: the optimizer's state,
    /// made in the first step only), or, past the last placed allocation, to the cache.
    pub(crate) fn realign(&self, i: usize, size: usize) -> Realign {
        let mut k = i;
        while k < self.requests.len() && self.requests[k] != size && self.cached(k) {
            k += 1;
        }
        if self.requests.get(k) == Some(&size) {
            Realign::At(k)
        } else if i >= self.last_placed {
            Realign::Extra
        } else {
            Realign::Deviate
        }
    }
}

/// A bin of new memory for the planned blocks no free block had room for: reserved (one
/// fixed segment of `bytes`) when the step first asks for one of them, so a step that leaves
/// the plan before then reserves nothing for it.
#[derive(Debug)]
pub(crate) struct Spare {
    /// The segment's size (whole large-segment rounding units).
    pub(crate) bytes: usize,
    /// Offset in the spare bin of each allocation of the step placed there.
    pub(crate) offsets: Vec<Option<usize>>,
    /// Its base address once reserved.
    pub(crate) base: Option<u64>,
}

/// Planned-steps state, behind the allocator's lock.
#[derive(Debug, Default)]
pub(crate) struct Planner {
    /// The step being recorded: allocations (alloc id, bytes; with their stream and address)
    /// and frees, in order.
    pub(crate) recording: Vec<(TraceEvent, StreamId, u64)>,
    /// Requests of the last recorded step, when it was packable.
    pub(crate) previous: Option<Vec<(usize, StreamId)>>,
    /// `num_ooms` at the last marker: a step in which an allocation failed is not planned.
    pub(crate) ooms: u64,
    /// The plan being served, if any.
    pub(crate) active: Option<Active>,
    /// Steps and allocations served so far.
    pub(crate) counts: PlannedCounts,
    /// Whether a packable step was recorded before (the first one is planned at once).
    pub(crate) recorded_before: bool,
    /// The thread that marked the last step ([`current_thread`]): only its allocations are
    /// recorded and planned.
    pub(crate) thread: u64,
}

/// A number for the calling thread, unique in the process (0 is no thread): what
/// [`Planner::thread`] compares, where `std::thread::current()` would take a reference count.
/// While a [`StepThread`] is entered on this thread, the number of the thread it was taken on.
pub(crate) fn current_thread() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static ID: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    match ACTING_FOR.with(std::cell::Cell::get) {
        0 => ID.with(|id| *id),
        acting => acting,
    }
}

thread_local! {
    /// The thread this one allocates for while a [`StepThread`] is entered (0: itself).
    static ACTING_FOR: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Which thread's allocations planned steps follow, carried onto another thread: a pass that a
/// thread hands whole to a worker (kiln's CPU passes run on its pool) then allocates as that
/// thread for planned steps, so the pass's blocks are recorded and planned with the thread's
/// own. Everything the worker allocates while it is entered counts, including work it picks
/// up from other tasks while it waits: work whose allocations come in an order that changes
/// from step to step enters [`StepThread::OUTSIDE`] for them (kiln's convolution tasks do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepThread(u64);

impl StepThread {
    /// No thread: allocations made while it is entered are never a planned step's (kernel
    /// scratch taken inside parallel tasks, whose order changes from step to step).
    pub const OUTSIDE: StepThread = StepThread(u64::MAX);

    /// The calling thread (or the thread it acts for).
    pub fn current() -> StepThread {
        StepThread(current_thread())
    }

    /// Makes the calling thread allocate as this one for planned steps until the guard drops.
    pub fn enter(self) -> StepThreadGuard {
        StepThreadGuard(ACTING_FOR.with(|c| c.replace(self.0)))
    }
}

/// Restores the thread's own identity for planned steps when dropped ([`StepThread::enter`]).
#[derive(Debug)]
pub struct StepThreadGuard(u64);

impl Drop for StepThreadGuard {
    fn drop(&mut self) {
        ACTING_FOR.with(|c| c.set(self.0));
    }
}

impl Planner {
    /// Notes an allocation served by the cache (recorded while no plan is active).
    pub(crate) fn record_alloc(
        &mut self,
        alloc_id: u64,
        bytes: usize,
        stream: StreamId,
        addr: u64,
    ) {
        if self.active.is_none() {
            let event = TraceEvent::Alloc {
                id: alloc_id,
                bytes,
            };
            self.recording.push((event, stream, addr));
        }
    }

    /// Notes a free of allocation `alloc_id`.
    pub(crate) fn record_free(&mut self, alloc_id: u64) {
        if self.active.is_none() {
            let event = TraceEvent::Free { id: alloc_id };
            self.recording.push((event, StreamId::DEFAULT, 0));
        }
    }

    /// The recorded step: the trace of the blocks it allocated and freed again, and every
    /// allocation it made (a block it allocated and left live, such as a batch that a Python
    /// loop frees only when the next step assigns the next one, is not in the trace: the cache
    /// serves it).
    pub(crate) fn recorded_step(&mut self) -> RecordedStep {
        let freed: HashSet<u64> = self
            .recording
            .iter()
            .filter_map(|(e, ..)| match *e {
                TraceEvent::Free { id } => Some(id),
                TraceEvent::Alloc { .. } => None,
            })
            .collect();
        let mut mine = HashSet::new();
        let mut step = RecordedStep::default();
        for (e, stream, addr) in self.recording.drain(..) {
            match e {
                TraceEvent::Alloc { id, bytes } => {
                    let inside = freed.contains(&id);
                    if inside {
                        mine.insert(id);
                        step.trace.events.push(e);
                    }
                    step.requests.push((bytes, stream));
                    step.addrs.push(addr);
                    step.inside.push(inside);
                }
                TraceEvent::Free { id } if mine.contains(&id) => step.trace.events.push(e),
                TraceEvent::Free { .. } => {}
            }
        }
        step
    }
}

/// One step as recorded between two markers.
#[derive(Debug, Default)]
pub(crate) struct RecordedStep {
    /// The blocks allocated and freed within the step, as a trace.
    pub(crate) trace: Trace,
    /// Every allocation of the step, in order: requested bytes and stream.
    pub(crate) requests: Vec<(usize, StreamId)>,
    /// The address the cache gave each allocation.
    pub(crate) addrs: Vec<u64>,
    /// Whether each allocation is in `trace` (freed within the step).
    pub(crate) inside: Vec<bool>,
}
