//! The ring of a recorded allocation history and the attribution of the blocks it knows:
//! the part of the recorder that knows nothing of the allocator's state.
//!
//! Invariants: `events` holds at most `max_entries` events, oldest first; `live` holds the
//! allocated blocks by address, `pending` the blocks freed by their owner that wait for other
//! streams; `live_before` the blocks live just before the oldest event (kept up to date as
//! events fall off the front, and counted in `dropped`).

use crate::backend::StreamId;
use crate::history::{Attribution, LiveBlock, MemoryEvent, MemoryEventKind};
use crate::stats::MemoryStats;
use std::collections::{HashMap, VecDeque};
use std::time::Instant;

/// The ring and the attribution of live blocks.
#[derive(Debug)]
pub(crate) struct Recorder {
    pub(crate) start: Instant,
    pub(crate) max_entries: usize,
    pub(crate) events: VecDeque<MemoryEvent>,
    pub(crate) dropped: u64,
    pub(crate) live: HashMap<u64, LiveBlock>,
    pub(crate) pending: HashMap<u64, LiveBlock>,
    pub(crate) live_before: HashMap<u64, LiveBlock>,
}

impl Recorder {
    /// A recorder of at most `max_entries` events, knowing the blocks allocated and pending
    /// now (they count as live before its first event, unattributed).
    pub(crate) fn new(
        max_entries: usize,
        live: HashMap<u64, LiveBlock>,
        pending: HashMap<u64, LiveBlock>,
    ) -> Recorder {
        Recorder {
            start: Instant::now(),
            max_entries,
            events: VecDeque::with_capacity(max_entries.min(1 << 16)),
            dropped: 0,
            live_before: live.clone(),
            live,
            pending,
        }
    }

    /// Drops the oldest event, folding what it left live into `live_before`.
    pub(crate) fn drop_oldest(&mut self) {
        let Some(old) = self.events.pop_front() else {
            return;
        };
        self.dropped += 1;
        match old.kind {
            MemoryEventKind::Alloc => {
                self.live_before.insert(
                    old.address,
                    LiveBlock {
                        address: old.address,
                        size: old.size,
                        stream: old.stream,
                        attribution: old.attribution,
                    },
                );
            }
            MemoryEventKind::FreeRequested => {
                self.live_before.remove(&old.address);
            }
            _ => {}
        }
    }

    pub(crate) fn push(&mut self, event: MemoryEvent) {
        while self.events.len() >= self.max_entries && !self.events.is_empty() {
            self.drop_oldest();
        }
        self.events.push_back(event);
    }

    pub(crate) fn event(
        &mut self,
        kind: MemoryEventKind,
        address: u64,
        size: usize,
        stream: StreamId,
        attribution: Attribution,
        stats: &MemoryStats,
    ) {
        self.event_with(kind, (address, size, stream), attribution, totals(stats));
    }

    /// Pushes one event of block or segment `(address, size, stream)` with the allocated and
    /// reserved bytes `after` it.
    pub(crate) fn event_with(
        &mut self,
        kind: MemoryEventKind,
        (address, size, stream): (u64, usize, StreamId),
        attribution: Attribution,
        (allocated_after, reserved_after): (usize, usize),
    ) {
        let time_us = u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.push(MemoryEvent {
            kind,
            address,
            size,
            stream,
            time_us,
            attribution,
            allocated_after,
            reserved_after,
        });
    }

    /// The largest live blocks now, largest first.
    pub(crate) fn top_live(&self, n: usize) -> Vec<LiveBlock> {
        let mut all: Vec<&LiveBlock> = self.live.values().collect();
        all.sort_by(|a, b| b.size.cmp(&a.size).then(a.address.cmp(&b.address)));
        all.into_iter().take(n).cloned().collect()
    }

    /// The attribution of the live block at `address`, if recorded.
    pub(crate) fn attribution_of(&self, address: u64) -> Option<&Attribution> {
        self.live.get(&address).map(|b| &b.attribution)
    }
}

/// Bytes allocated and reserved now.
pub(crate) fn totals(stats: &MemoryStats) -> (usize, usize) {
    (
        stats.allocated_bytes.all.current.max(0) as usize,
        stats.reserved_bytes.all.current.max(0) as usize,
    )
}
