//! The data of kiln's memory picture: from recorded [`MemoryEvent`]s, the bytes live in each
//! [`MemoryCategory`] after every event, the allocated and reserved totals, the peak, and the
//! blocks live at the peak with who allocated them.
//!
//! Invariants:
//! - A block counts from its `alloc` to its `free_requested` (kiln's `memory_allocated`), in the
//!   category its `alloc` declared (`Unknown` when none), whatever the freeing thread declared.
//! - Bytes live before the first event are the history's `live_before` blocks, with their
//!   attribution ([`MemoryTimeline::from_history`]); read from a file, where they are not known
//!   ([`MemoryTimeline::from_events`]), they are `Unknown`: `first.allocated_after` minus what
//!   the first event itself added.
//! - So for a history recorded without drops, the categories add up to `allocated_after` at
//!   every point; [`MemoryTimeline::unexplained`] counts the points where they do not.
//! - Points before `first_pictured` are replayed (their blocks stay live, attributed) but not
//!   kept: a picture of one step still knows which module owns the parameters made earlier.

use crate::history::{LiveBlock, MemoryCategory, MemoryEvent, MemoryEventKind};
use crate::recorded::MemoryHistory;
use crate::snapshot_pickle::CATEGORIES;
use std::collections::HashMap;

/// Live bytes per category over a stretch of history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryTimeline {
    /// Time of each point (microseconds on the recorder's clock).
    pub times_us: Vec<u64>,
    /// Live bytes of each category that is non-zero somewhere, in [`CATEGORIES`] order (the
    /// stack order, bottom first); one value per point.
    pub by_category: Vec<(MemoryCategory, Vec<usize>)>,
    /// `allocated_after` of each point.
    pub allocated: Vec<usize>,
    /// `reserved_after` of each point.
    pub reserved: Vec<usize>,
    /// The point of the highest `allocated` (the first such).
    pub peak: usize,
    /// Blocks live at the peak, largest first.
    pub live_at_peak: Vec<LiveBlock>,
    /// Points where the categories do not add up to `allocated` (0 for a complete history).
    pub unexplained: usize,
}

fn category_index(c: Option<MemoryCategory>) -> usize {
    let c = c.unwrap_or(MemoryCategory::Unknown);
    CATEGORIES
        .iter()
        .position(|&x| x == c)
        .unwrap_or(CATEGORIES.len() - 1)
}

impl MemoryTimeline {
    /// The timeline of `events[first_pictured..]`, replaying `events[..first_pictured]` for the
    /// state it starts from (module docs). `first_pictured` past the end keeps no point.
    pub fn from_events(events: &[MemoryEvent], first_pictured: usize) -> MemoryTimeline {
        let before = events.first().map_or(0, |first| {
            let own = match first.kind {
                MemoryEventKind::Alloc => first.size as i128,
                MemoryEventKind::FreeRequested => -(first.size as i128),
                _ => 0,
            };
            first.allocated_after as i128 - own
        });
        Self::build(&[], before, events, first_pictured)
    }

    /// The timeline of `history.events[first_pictured..]`, starting from its `live_before`
    /// blocks and the events before `first_pictured`.
    pub fn from_history(history: &MemoryHistory, first_pictured: usize) -> MemoryTimeline {
        Self::build(&history.live_before, 0, &history.events, first_pictured)
    }

    fn build(
        live_before: &[LiveBlock],
        unknown_before: i128,
        events: &[MemoryEvent],
        first_pictured: usize,
    ) -> MemoryTimeline {
        let unknown = CATEGORIES.len() - 1;
        let mut live_by_cat = [0i128; CATEGORIES.len()];
        live_by_cat[unknown] = unknown_before;
        let mut blocks: HashMap<u64, (usize, LiveBlock)> = HashMap::new();
        for b in live_before {
            let c = category_index(b.attribution.category);
            live_by_cat[c] += b.size as i128;
            blocks.insert(b.address, (c, b.clone()));
        }
        let mut out = MemoryTimeline {
            times_us: Vec::new(),
            by_category: Vec::new(),
            allocated: Vec::new(),
            reserved: Vec::new(),
            peak: 0,
            live_at_peak: Vec::new(),
            unexplained: 0,
        };
        let mut series: Vec<Vec<usize>> = vec![Vec::new(); CATEGORIES.len()];
        let mut peak_bytes = None;
        for (i, e) in events.iter().enumerate() {
            match e.kind {
                MemoryEventKind::Alloc => {
                    let c = category_index(e.attribution.category);
                    live_by_cat[c] += e.size as i128;
                    let block = LiveBlock {
                        address: e.address,
                        size: e.size,
                        stream: e.stream,
                        attribution: e.attribution.clone(),
                    };
                    blocks.insert(e.address, (c, block));
                }
                MemoryEventKind::FreeRequested => {
                    let c = blocks.remove(&e.address).map_or(unknown, |(c, _)| c);
                    live_by_cat[c] -= e.size as i128;
                }
                _ => {}
            }
            if i < first_pictured {
                continue;
            }
            let clamp = |v: i128| v.clamp(0, usize::MAX as i128) as usize;
            for (s, &v) in series.iter_mut().zip(&live_by_cat) {
                s.push(clamp(v));
            }
            if live_by_cat.iter().sum::<i128>() != e.allocated_after as i128 {
                out.unexplained += 1;
            }
            out.times_us.push(e.time_us);
            out.allocated.push(e.allocated_after);
            out.reserved.push(e.reserved_after);
            if peak_bytes.is_none_or(|p| e.allocated_after > p) {
                peak_bytes = Some(e.allocated_after);
                out.peak = out.times_us.len() - 1;
                out.live_at_peak = blocks.values().map(|(_, b)| b.clone()).collect();
            }
        }
        out.live_at_peak
            .sort_by(|a, b| b.size.cmp(&a.size).then(a.address.cmp(&b.address)));
        out.by_category = CATEGORIES
            .iter()
            .zip(series)
            .filter(|(_, s)| s.iter().any(|&v| v > 0))
            .map(|(&c, s)| (c, s))
            .collect();
        out
    }

    /// Bytes allocated at the peak (0 for an empty timeline).
    pub fn peak_bytes(&self) -> usize {
        self.allocated.get(self.peak).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::StreamId;
    use crate::history::Attribution;
    use std::sync::Arc;

    fn ev(
        kind: MemoryEventKind,
        address: u64,
        size: usize,
        cat: Option<MemoryCategory>,
        after: usize,
    ) -> MemoryEvent {
        MemoryEvent {
            kind,
            address,
            size,
            stream: StreamId::DEFAULT,
            time_us: address,
            attribution: Attribution {
                category: cat,
                op: None,
                module: Some(Arc::from(format!("m{address}"))),
            },
            allocated_after: after,
            reserved_after: 1 << 20,
        }
    }

    #[test]
    fn categories_add_up_and_frees_leave_the_allocating_category() {
        use MemoryCategory::*;
        use MemoryEventKind::*;
        let events = [
            ev(Alloc, 1, 512, Some(Parameter), 512 + 1024),
            ev(Alloc, 2, 2048, Some(Activation), 2560 + 1024),
            ev(Alloc, 3, 1024, None, 3584 + 1024),
            // Freed by a thread that declared Gradient: still leaves Activation.
            ev(FreeRequested, 2, 2048, Some(Gradient), 1536 + 1024),
            ev(FreeCompleted, 2, 2048, Some(Gradient), 1536 + 1024),
        ];
        let t = MemoryTimeline::from_events(&events, 0);
        assert_eq!(t.unexplained, 0);
        for i in 0..events.len() {
            let sum: usize = t.by_category.iter().map(|(_, s)| s[i]).sum();
            assert_eq!(sum, t.allocated[i], "point {i}");
        }
        let cats: Vec<_> = t.by_category.iter().map(|(c, _)| *c).collect();
        assert_eq!(cats, [Parameter, Activation, Unknown]);
        // 1024 bytes were live before recording: Unknown from the start.
        assert_eq!(t.by_category[2].1, [1024, 1024, 2048, 2048, 2048]);
        assert_eq!(t.by_category[1].1, [0, 2048, 2048, 0, 0]);
        assert_eq!((t.peak, t.peak_bytes()), (2, 4608));
        let sizes: Vec<_> = t.live_at_peak.iter().map(|b| (b.size, b.address)).collect();
        assert_eq!(sizes, [(2048, 2), (1024, 3), (512, 1)]);
        assert_eq!(t.live_at_peak[0].attribution.module.as_deref(), Some("m2"));
    }

    #[test]
    fn the_replayed_prefix_is_not_drawn_but_keeps_its_attribution() {
        use MemoryCategory::*;
        use MemoryEventKind::*;
        let events = [
            ev(Alloc, 1, 4096, Some(Parameter), 4096),
            ev(Alloc, 2, 512, Some(Temporary), 4608),
            ev(FreeRequested, 2, 512, None, 4096),
        ];
        let t = MemoryTimeline::from_events(&events, 1);
        assert_eq!(t.times_us, [2, 2]);
        assert_eq!(t.by_category[0], (Parameter, vec![4096, 4096]));
        assert_eq!(t.by_category[1], (Temporary, vec![512, 0]));
        assert_eq!(t.live_at_peak[0].size, 4096);
        assert_eq!(t.unexplained, 0);
        // A history with a missing alloc (dropped from the ring) is counted, not hidden.
        let t = MemoryTimeline::from_events(&events[2..], 0);
        assert_eq!(
            t.unexplained, 0,
            "the first event's own bytes set the baseline"
        );
        let gap = [events[0].clone(), events[2].clone()];
        assert_eq!(MemoryTimeline::from_events(&gap, 0).unexplained, 1);
        assert!(MemoryTimeline::from_events(&events, 9).times_us.is_empty());
    }

    #[test]
    fn from_history_starts_from_the_blocks_live_before_with_their_attribution() {
        use MemoryCategory::*;
        use MemoryEventKind::*;
        let param = ev(Alloc, 7, 8192, Some(Parameter), 8192);
        let live_before = vec![LiveBlock {
            address: 7,
            size: 8192,
            stream: StreamId::DEFAULT,
            attribution: param.attribution.clone(),
        }];
        let history = MemoryHistory {
            events: vec![
                ev(Alloc, 8, 512, Some(Temporary), 8704),
                ev(FreeRequested, 7, 8192, None, 512),
            ],
            dropped: 3,
            max_entries: 2,
            recording: true,
            expandable_segments: false,
            live_before,
            snapshot: crate::MemorySnapshot {
                segments: vec![],
                stats: Default::default(),
            },
        };
        let t = MemoryTimeline::from_history(&history, 0);
        assert_eq!(t.unexplained, 0);
        assert_eq!(t.by_category[0], (Parameter, vec![8192, 0]));
        assert_eq!(t.live_at_peak[0].attribution.module.as_deref(), Some("m7"));
        // Read from a file the same bytes are Unknown.
        let u = MemoryTimeline::from_events(&history.events, 0);
        assert_eq!(u.by_category.last().unwrap(), &(Unknown, vec![8192, 0]));
    }
}
