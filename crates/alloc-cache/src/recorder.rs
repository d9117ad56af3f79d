//! The recorder's hooks in the allocator's locked state and the allocator's entry points:
//! [`CachingAllocator::record_memory_history`], `memory_history`, `reattribute`.
//!
//! Invariant: while recording is off the state's recorder slot is `None` and every hook is one
//! test of it (the allocator tests it before calling in).

use crate::allocator::CachingAllocator;
use crate::backend::StreamId;
use crate::block::{BlockState, State};
use crate::context;
use crate::error::{Error, Result};
use crate::history::{Attribution, LiveBlock, MemoryCategory, MemoryEventKind};
use crate::recorded::MemoryHistory;
use crate::ring::{totals, Recorder};
use std::collections::HashMap;

/// The blocks allocated and pending in `st` now, unattributed.
fn blocks_now(st: &State) -> (HashMap<u64, LiveBlock>, HashMap<u64, LiveBlock>) {
    let mut live = HashMap::new();
    let mut pending = HashMap::new();
    for b in &st.blocks {
        let block = LiveBlock {
            address: b.addr,
            size: b.size,
            stream: st
                .streams
                .get(b.stream as usize)
                .map_or(StreamId::DEFAULT, |s| s.stream),
            attribution: Attribution::default(),
        };
        match b.state {
            BlockState::Allocated => {
                live.insert(b.addr, block);
            }
            BlockState::Pending => {
                pending.insert(b.addr, block);
            }
            BlockState::Free
            | BlockState::Unmapped
            | BlockState::Lent
            | BlockState::Arena
            | BlockState::Dead => {}
        }
    }
    (live, pending)
}

/// Records block `(address, size)` on `stream` as live with `attribution`.
fn insert_live(
    live: &mut HashMap<u64, LiveBlock>,
    address: u64,
    size: usize,
    stream: StreamId,
    attribution: Attribution,
) {
    let block = LiveBlock {
        address,
        size,
        stream,
        attribution,
    };
    live.insert(address, block);
}

impl State {
    /// Records that block `(address, size)` on `stream` was just handed out.
    pub(crate) fn history_alloc(&mut self, address: u64, size: usize, stream: StreamId) {
        let Some(h) = self.history.as_mut() else {
            return;
        };
        let attribution = context::current_attribution();
        insert_live(&mut h.live, address, size, stream, attribution.clone());
        h.event(
            MemoryEventKind::Alloc,
            address,
            size,
            stream,
            attribution,
            &self.stats,
        );
    }

    /// Records that the owner of the block at `address` returned it; `completed` when it is
    /// free for reuse at once (no other stream used it).
    pub(crate) fn history_free(&mut self, address: u64, size: usize, completed: bool) {
        let Some(h) = self.history.as_mut() else {
            return;
        };
        let block = h.live.remove(&address).unwrap_or(LiveBlock {
            address,
            size,
            stream: StreamId::DEFAULT,
            attribution: Attribution::default(),
        });
        let (stream, attribution) = (block.stream, block.attribution.clone());
        h.event(
            MemoryEventKind::FreeRequested,
            address,
            size,
            stream,
            attribution.clone(),
            &self.stats,
        );
        if completed {
            h.event(
                MemoryEventKind::FreeCompleted,
                address,
                size,
                stream,
                attribution,
                &self.stats,
            );
        } else {
            h.pending.insert(address, block);
        }
    }

    /// Records that the pending block at `address` became free for reuse.
    pub(crate) fn history_free_completed(&mut self, address: u64, size: usize) {
        let Some(h) = self.history.as_mut() else {
            return;
        };
        let (stream, attribution) = h
            .pending
            .remove(&address)
            .map_or((StreamId::DEFAULT, Attribution::default()), |b| {
                (b.stream, b.attribution)
            });
        h.event(
            MemoryEventKind::FreeCompleted,
            address,
            size,
            stream,
            attribution,
            &self.stats,
        );
    }

    /// Records a segment event (`SegmentAlloc`, `SegmentFree`) of segment stream index `si`.
    pub(crate) fn history_segment(
        &mut self,
        kind: MemoryEventKind,
        address: u64,
        size: usize,
        si: u16,
    ) {
        let Some(h) = self.history.as_mut() else {
            return;
        };
        let stream = self
            .streams
            .get(si as usize)
            .map_or(StreamId::DEFAULT, |s| s.stream);
        h.event(
            kind,
            address,
            size,
            stream,
            context::current_attribution(),
            &self.stats,
        );
    }

    /// Records a failed request of `size` bytes on stream index `si`.
    pub(crate) fn history_oom(&mut self, size: usize, si: u16) {
        self.history_segment(MemoryEventKind::Oom, 0, size, si);
    }
}

impl CachingAllocator {
    /// Starts or stops recording the allocation history (PyTorch's
    /// `torch.cuda.memory._record_memory_history`): with `enabled`, every alloc, free, segment
    /// and out-of-memory event from now on is kept, at most `max_entries` of them (the oldest
    /// are dropped first and counted). Enabling while recording keeps what was recorded and
    /// applies the new capacity; disabling keeps the events readable with
    /// [`memory_history`](Self::memory_history) until recording starts again, which begins a
    /// new history. Errors when `max_entries` is 0.
    pub fn record_memory_history(&self, enabled: bool, max_entries: usize) -> Result<()> {
        if enabled && max_entries == 0 {
            return Err(Error::InvalidConfig(
                "record_memory_history: max_entries is 0, so nothing could be kept; pass the \
                 number of events to keep (PyTorch's default keeps 100000 for a few steps)"
                    .into(),
            ));
        }
        let mut st = self.lock();
        match (enabled, st.history.is_some()) {
            (true, true) => {
                let h = st.history.as_mut().expect("recording");
                h.max_entries = max_entries;
                while h.events.len() > max_entries {
                    h.drop_oldest();
                }
            }
            (true, false) => {
                st.history_kept = None;
                let (live, pending) = blocks_now(&st);
                st.history = Some(Box::new(Recorder::new(max_entries, live, pending)));
                context::recording_started();
            }
            (false, true) => {
                st.history_kept = st.history.take();
                context::recording_stopped();
            }
            (false, false) => {}
        }
        Ok(())
    }

    /// Whether the allocation history is being recorded.
    pub fn is_recording_history(&self) -> bool {
        self.lock().history.is_some()
    }

    /// The recorded history: the events in the ring, how many were dropped, the blocks live
    /// before the first of them, and the segments now (taken under one lock). Empty when
    /// recording never started.
    pub fn memory_history(&self) -> MemoryHistory {
        self.with_state(|st| {
            let snapshot = self.snapshot_of(st);
            let recording = st.history.is_some();
            let Some(h) = st.history.as_ref().or(st.history_kept.as_ref()) else {
                return MemoryHistory {
                    events: Vec::new(),
                    dropped: 0,
                    max_entries: 0,
                    recording,
                    expandable_segments: self.config.expandable_segments,
                    live_before: Vec::new(),
                    snapshot,
                };
            };
            let mut live_before: Vec<LiveBlock> = h.live_before.values().cloned().collect();
            live_before.sort_by_key(|b| b.address);
            MemoryHistory {
                events: h.events.iter().cloned().collect(),
                dropped: h.dropped,
                max_entries: h.max_entries,
                recording,
                expandable_segments: self.config.expandable_segments,
                live_before,
                snapshot,
            }
        })
    }

    /// Changes the category of the live block at `address` (a tensor whose role changed: a
    /// backward result kept as a parameter's gradient). Recorded as the block's free and a new
    /// alloc at the same address with the new category, so the per-category sums stay exact.
    /// Does nothing when history is off, when the block is not live, or when it already has
    /// that category; returns whether it recorded the change.
    pub fn reattribute(&self, address: u64, category: MemoryCategory) -> bool {
        let mut st = self.lock();
        let Some(h) = st.history.as_ref() else {
            return false;
        };
        let Some(block) = h.live.get(&address) else {
            return false;
        };
        if block.attribution.category == Some(category) {
            return false;
        }
        let (size, stream) = (block.size, block.stream);
        let mut attribution = block.attribution.clone();
        attribution.category = Some(category);
        let State { history, stats, .. } = &mut *st;
        let h = history.as_mut().expect("checked above");
        let (allocated, reserved) = totals(stats);
        let old = h.live.remove(&address).expect("checked above").attribution;
        let block = (address, size, stream);
        let between = (allocated - size, reserved);
        h.event_with(MemoryEventKind::FreeRequested, block, old.clone(), between);
        h.event_with(MemoryEventKind::FreeCompleted, block, old, between);
        insert_live(&mut h.live, address, size, stream, attribution.clone());
        h.event_with(
            MemoryEventKind::Alloc,
            block,
            attribution,
            (allocated, reserved),
        );
        true
    }

    /// The attribution recorded for the live block at `address` (`None` when history is off
    /// or the block was not allocated while recording).
    pub fn attribution_of(&self, address: u64) -> Option<Attribution> {
        let st = self.lock();
        st.history.as_ref()?.attribution_of(address).cloned()
    }
}
