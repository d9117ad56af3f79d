//! [`MemoryHistory`]: what `memory_history()` returns, and the replays that answer questions
//! about it (live bytes per category at each event, the peak, the blocks live at an event, a
//! window of the events).
//!
//! Invariant: every replay starts from `live_before` and applies `Alloc` (adds the block) and
//! `FreeRequested` (removes it) only, the two events that change allocated bytes, so a replay
//! agrees with `allocated_after` at every event.

use crate::history::{CategoryBytes, LiveBlock, MemoryCategory, MemoryEvent, MemoryEventKind};
use crate::snapshot::MemorySnapshot;

/// What [`CachingAllocator::memory_history`](crate::CachingAllocator::memory_history) returns:
/// the events in the ring, what was dropped, and the state to rebuild segments and live blocks
/// at any event.
#[derive(Debug, Clone)]
pub struct MemoryHistory {
    /// Events in the order they happened (oldest first).
    pub events: Vec<MemoryEvent>,
    /// Events dropped from the front of the ring because it was full.
    pub dropped: u64,
    /// The ring's capacity.
    pub max_entries: usize,
    /// Whether recording is still on.
    pub recording: bool,
    /// Whether segment events are page maps / unmaps of expandable segments (PyTorch's
    /// `segment_map` / `segment_unmap`) rather than whole segments (`segment_alloc` / `free`).
    pub expandable_segments: bool,
    /// Blocks live just before the first event in `events` (those allocated before recording
    /// started, or by dropped events), sorted by address.
    pub live_before: Vec<LiveBlock>,
    /// Segments and blocks now (taken under the same lock as `events`; allocated blocks carry
    /// their attribution), from which earlier segment layouts follow by undoing events.
    pub snapshot: MemorySnapshot,
}

impl MemoryHistory {
    /// Replays the events from `live_before`, calling `visit(index, live)` after each event
    /// with the blocks live at that moment, by address.
    pub fn replay(
        &self,
        mut visit: impl FnMut(usize, &std::collections::BTreeMap<u64, LiveBlock>),
    ) {
        let mut live: std::collections::BTreeMap<u64, LiveBlock> = self
            .live_before
            .iter()
            .map(|b| (b.address, b.clone()))
            .collect();
        for (i, e) in self.events.iter().enumerate() {
            match e.kind {
                MemoryEventKind::Alloc => {
                    live.insert(
                        e.address,
                        LiveBlock {
                            address: e.address,
                            size: e.size,
                            stream: e.stream,
                            attribution: e.attribution.clone(),
                        },
                    );
                }
                MemoryEventKind::FreeRequested => {
                    live.remove(&e.address);
                }
                _ => {}
            }
            visit(i, &live);
        }
    }

    /// Live bytes per category right after each event (one entry per event).
    pub fn category_bytes(&self) -> Vec<CategoryBytes> {
        let mut now = CategoryBytes::default();
        for b in &self.live_before {
            now.add(b.attribution.category_or_unknown(), b.size);
        }
        let mut sizes: std::collections::HashMap<u64, (MemoryCategory, usize)> = self
            .live_before
            .iter()
            .map(|b| (b.address, (b.attribution.category_or_unknown(), b.size)))
            .collect();
        let mut out = Vec::with_capacity(self.events.len());
        for e in &self.events {
            match e.kind {
                MemoryEventKind::Alloc => {
                    let c = e.attribution.category_or_unknown();
                    now.add(c, e.size);
                    sizes.insert(e.address, (c, e.size));
                }
                MemoryEventKind::FreeRequested => {
                    if let Some((c, size)) = sizes.remove(&e.address) {
                        now.sub(c, size);
                    }
                }
                _ => {}
            }
            out.push(now);
        }
        out
    }

    /// The event at which `allocated_after` is largest (the first such) and the live bytes per
    /// category there; `None` without events.
    pub fn peak(&self) -> Option<(usize, CategoryBytes)> {
        let by_event = self.category_bytes();
        let (index, _) = self
            .events
            .iter()
            .enumerate()
            .rev()
            .max_by_key(|(_, e)| e.allocated_after)?;
        Some((index, by_event[index]))
    }

    /// Each category's largest live bytes over the events (each at its own moment).
    pub fn max_by_category(&self) -> CategoryBytes {
        self.category_bytes()
            .iter()
            .fold(CategoryBytes::default(), |acc, c| acc.max(c))
    }

    /// The history from event `index` on (a window such as one training step): its
    /// `live_before` is what was live just before that event. `index` past the end gives no
    /// events.
    pub fn since(&self, index: usize) -> MemoryHistory {
        let index = index.min(self.events.len());
        let mut live_before = match index {
            0 => self.live_before.clone(),
            i => self.live_at(i - 1),
        };
        live_before.sort_by_key(|b| b.address);
        MemoryHistory {
            events: self.events[index..].to_vec(),
            dropped: self.dropped + index as u64,
            live_before,
            ..self.clone()
        }
    }

    /// The blocks live right after event `index`, largest first.
    pub fn live_at(&self, index: usize) -> Vec<LiveBlock> {
        let mut out = Vec::new();
        self.replay(|i, live| {
            if i == index {
                out = live.values().cloned().collect();
            }
        });
        out.sort_by(|a, b| b.size.cmp(&a.size).then(a.address.cmp(&b.address)));
        out
    }
}
