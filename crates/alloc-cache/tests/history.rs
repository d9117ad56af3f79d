//! The allocation history: which events are recorded with what, the per-category sums against
//! `allocated_after` at every event (random sequences over fixed and expandable segments, with
//! streams, out-of-memory failures, cache releases and re-attribution), the ring's drops, and
//! attribution from the thread's context.

use kiln_alloc_cache::synth::SplitMix64;
use kiln_alloc_cache::*;
use std::sync::Arc;

const MIB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

fn sim_alloc(capacity: usize, expandable: bool) -> (Arc<SimBackend>, CachingAllocator) {
    let sim = Arc::new(SimBackend::new(capacity).with_page_granularity(2 * MIB));
    let config = AllocatorConfig {
        expandable_segments: expandable,
        ..AllocatorConfig::default()
    };
    (
        Arc::clone(&sim),
        CachingAllocator::new(sim, config).unwrap(),
    )
}

/// The per-category live bytes equal `allocated_after` at every event, and the last one equals
/// the allocator's statistic now.
fn assert_sums_exact(a: &CachingAllocator, h: &MemoryHistory) {
    let by_event = h.category_bytes();
    assert_eq!(by_event.len(), h.events.len());
    for (i, (e, c)) in h.events.iter().zip(&by_event).enumerate() {
        assert_eq!(c.total(), e.allocated_after, "event {i}: {e:?}, {c:?}");
    }
    if let Some(last) = h.events.last() {
        let s = a.memory_stats();
        assert_eq!(last.allocated_after as i64, s.allocated_bytes.all.current);
        assert_eq!(last.reserved_after as i64, s.reserved_bytes.all.current);
    }
}

#[test]
fn off_by_default_and_nothing_is_recorded() {
    let (_, a) = sim_alloc(1 << 30, false);
    assert!(!a.is_recording_history());
    let x = a.allocate_raw(1000, S0).unwrap();
    a.free_raw(x).unwrap();
    let h = a.memory_history();
    assert!(h.events.is_empty() && !h.recording && h.dropped == 0);
    assert!(a.record_memory_history(true, 0).is_err(), "max_entries 0");
}

#[test]
fn events_of_one_alloc_and_free_with_segments() {
    let (_, a) = sim_alloc(1 << 30, false);
    a.record_memory_history(true, 1000).unwrap();
    let x = a.allocate_raw(1000, S0).unwrap();
    let addr = x.addr();
    a.free_raw(x).unwrap();
    a.empty_cache().unwrap();
    let h = a.memory_history();
    use MemoryEventKind::*;
    let kinds: Vec<_> = h.events.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            SegmentAlloc,
            Alloc,
            FreeRequested,
            FreeCompleted,
            SegmentFree
        ]
    );
    let e = &h.events;
    assert_eq!((e[0].address, e[0].size), (addr, 2 * MIB));
    assert_eq!((e[1].address, e[1].size), (addr, 1024), "the block's size");
    assert_eq!((e[1].allocated_after, e[1].reserved_after), (1024, 2 * MIB));
    assert_eq!((e[2].allocated_after, e[2].reserved_after), (0, 2 * MIB));
    assert_eq!((e[4].allocated_after, e[4].reserved_after), (0, 0));
    assert!(e.windows(2).all(|w| w[0].time_us <= w[1].time_us));
    assert!(!h.expandable_segments && h.recording && h.dropped == 0);
    assert_sums_exact(&a, &h);
}

#[test]
fn expandable_segments_record_page_maps_and_unmaps() {
    let (_, a) = sim_alloc(1 << 30, true);
    a.record_memory_history(true, 1000).unwrap();
    let x = a.allocate_raw(5 * MIB, S0).unwrap();
    a.free_raw(x).unwrap();
    a.empty_cache().unwrap();
    let h = a.memory_history();
    assert!(h.expandable_segments);
    let maps: usize = h
        .events
        .iter()
        .filter(|e| e.kind == MemoryEventKind::SegmentAlloc)
        .map(|e| e.size)
        .sum();
    let unmaps: usize = h
        .events
        .iter()
        .filter(|e| e.kind == MemoryEventKind::SegmentFree)
        .map(|e| e.size)
        .sum();
    assert_eq!((maps, unmaps), (6 * MIB, 6 * MIB), "three 2 MiB pages");
    assert_sums_exact(&a, &h);
}

#[test]
fn a_free_waiting_for_another_stream_completes_later() {
    let (sim, a) = sim_alloc(1 << 30, false);
    a.record_memory_history(true, 1000).unwrap();
    let x = a.allocate_raw(4096, S0).unwrap();
    let addr = x.addr();
    a.record_stream(&x, StreamId(2)).unwrap();
    a.free_raw(x).unwrap();
    let kinds = |h: &MemoryHistory| h.events.iter().map(|e| e.kind).collect::<Vec<_>>();
    use MemoryEventKind::*;
    assert_eq!(
        kinds(&a.memory_history()),
        [SegmentAlloc, Alloc, FreeRequested]
    );
    sim.complete_all_events();
    drop(a.allocate_raw(4096, S0).map(|y| a.free_raw(y)));
    let h = a.memory_history();
    let done = h
        .events
        .iter()
        .position(|e| e.kind == FreeCompleted)
        .unwrap();
    assert_eq!(h.events[done].address, addr);
    assert_eq!(h.events[done].allocated_after, 0);
    assert_sums_exact(&a, &h);
}

#[test]
fn out_of_memory_is_an_event_with_the_request() {
    let (_, a) = sim_alloc(64 * MIB, false);
    a.record_memory_history(true, 1000).unwrap();
    let keep = a.allocate_raw(40 * MIB, S0).unwrap();
    assert!(a.allocate_raw(30 * MIB + 1, S0).is_err());
    let h = a.memory_history();
    let oom = h.events.last().unwrap();
    assert_eq!(
        (oom.kind, oom.size, oom.allocated_after),
        (MemoryEventKind::Oom, 30 * MIB + 1, 40 * MIB)
    );
    a.free_raw(keep).unwrap();
}

#[test]
fn the_ring_drops_the_oldest_and_counts_them_and_sums_stay_exact() {
    let (_, a) = sim_alloc(1 << 30, false);
    let before = a.allocate_raw(3000, S0).unwrap(); // live before recording: Unknown
    a.record_memory_history(true, 4).unwrap();
    let _param = AllocContext::category(MemoryCategory::Parameter);
    let blocks: Vec<_> = (0..6).map(|_| a.allocate_raw(512, S0).unwrap()).collect();
    let h = a.memory_history();
    assert_eq!((h.events.len(), h.dropped, h.max_entries), (4, 2, 4));
    assert_eq!(h.events[0].address, blocks[2].addr(), "the two oldest went");
    // Live before the ring's first event: the block from before recording and two dropped.
    let lb: Vec<_> = h.live_before.iter().map(|b| (b.address, b.size)).collect();
    let mut expected = vec![
        (before.addr(), 3072),
        (blocks[0].addr(), 512),
        (blocks[1].addr(), 512),
    ];
    expected.sort();
    assert_eq!(lb, expected);
    assert_eq!(
        h.live_before[0].attribution.category_or_unknown(),
        MemoryCategory::Unknown
    );
    assert_sums_exact(&a, &h);
    let last = h.category_bytes().pop().unwrap();
    assert_eq!(
        (
            last.get(MemoryCategory::Parameter),
            last.get(MemoryCategory::Unknown)
        ),
        (6 * 512, 3072)
    );
    // Shrinking the ring drops more, still counted.
    a.record_memory_history(true, 2).unwrap();
    let h = a.memory_history();
    assert_eq!((h.events.len(), h.dropped), (2, 4));
    assert_sums_exact(&a, &h);
    // Stopping keeps the history readable; starting again begins a new one.
    a.record_memory_history(false, 2).unwrap();
    a.free_raw(before).unwrap();
    let h = a.memory_history();
    assert!(!h.recording && h.events.len() == 2);
    a.record_memory_history(true, 10).unwrap();
    assert!(a.memory_history().events.is_empty());
    for b in blocks {
        a.free_raw(b).unwrap();
    }
    assert_sums_exact(&a, &a.memory_history());
}

#[test]
fn attribution_comes_from_the_thread_context_and_reaches_the_snapshot() {
    let (_, a) = sim_alloc(1 << 30, false);
    a.record_memory_history(true, 1000).unwrap();
    let w = {
        let _m = AllocContext::module("layer3");
        let _m1 = AllocContext::module("1");
        let _op = AllocContext::op("conv2d", MemoryCategory::Activation);
        let _m2 = AllocContext::module("conv2");
        a.allocate_raw(2048, S0).unwrap()
    };
    let g = {
        let _op = AllocContext::op("ConvolutionBackward", MemoryCategory::Temporary);
        a.allocate_raw(1024, S0).unwrap()
    };
    let h = a.memory_history();
    let alloc = &h.events[1];
    assert_eq!(alloc.attribution.module.as_deref(), Some("layer3.1.conv2"));
    assert_eq!(alloc.attribution.op.as_deref(), Some("conv2d"));
    assert_eq!(alloc.attribution.category, Some(MemoryCategory::Activation));
    let snap = a.snapshot();
    let attr = |addr: u64| {
        snap.segments
            .iter()
            .flat_map(|s| &s.blocks)
            .find(|b| b.address == addr)
            .and_then(|b| b.attribution.clone())
    };
    assert_eq!(attr(w.addr()).unwrap().op.as_deref(), Some("conv2d"));
    assert!(snap.to_json().contains("\"category\": \"activation\""));
    // The gradient kept as it is changes category: free + alloc at the same address.
    assert!(a.reattribute(g.addr(), MemoryCategory::Gradient));
    assert!(
        !a.reattribute(g.addr(), MemoryCategory::Gradient),
        "no change"
    );
    let h = a.memory_history();
    let n = h.events.len();
    use MemoryEventKind::*;
    let tail: Vec<_> = h.events[n - 3..].iter().map(|e| e.kind).collect();
    assert_eq!(tail, [FreeRequested, FreeCompleted, Alloc]);
    assert_eq!(h.events[n - 2].allocated_after, 2048);
    assert_eq!(h.events[n - 1].allocated_after, 3072);
    let last = h.category_bytes().pop().unwrap();
    assert_eq!(last.get(MemoryCategory::Gradient), 1024);
    assert_eq!(last.get(MemoryCategory::Temporary), 0);
    assert_eq!(
        a.attribution_of(g.addr()).unwrap().op.as_deref(),
        Some("ConvolutionBackward")
    );
    assert_sums_exact(&a, &h);
    a.free_raw(w).unwrap();
    a.free_raw(g).unwrap();
}

/// Random alloc / free / record_stream / empty_cache / re-attribution sequences with a small
/// ring: the sums hold at every event, across drops.
#[test]
fn per_category_sums_equal_allocated_at_every_event_of_random_runs() {
    let categories = MemoryCategory::ALL;
    for (seed, expandable, ring) in [(1u64, false, 100_000), (2, true, 100_000), (3, false, 97)] {
        let (sim, a) = sim_alloc(256 * MIB, expandable);
        let mut rng = SplitMix64(seed);
        let mut live: Vec<RawAllocation> = (0..3)
            .map(|_| a.allocate_raw(100_000, S0).unwrap())
            .collect();
        a.record_memory_history(true, ring).unwrap();
        for step in 0..3000 {
            let cat = categories[rng.range(0, 6) as usize];
            let _scope = AllocContext::category(cat);
            match rng.range(0, 99) {
                0..=54 => {
                    let size = match rng.range(0, 9) {
                        0..=6 => rng.range(0, MIB as u64) as usize,
                        _ => rng.range(MIB as u64, 30 * MIB as u64) as usize,
                    };
                    let stream = StreamId(rng.range(0, 1));
                    if let Ok(x) = a.allocate_raw(size, stream) {
                        live.push(x);
                    }
                }
                55..=89 if !live.is_empty() => {
                    let x = live.swap_remove(rng.range(0, live.len() as u64 - 1) as usize);
                    if rng.range(0, 3) == 0 {
                        a.record_stream(&x, StreamId(5)).unwrap();
                    }
                    a.free_raw(x).unwrap();
                }
                90..=94 if !live.is_empty() => {
                    let x = &live[rng.range(0, live.len() as u64 - 1) as usize];
                    a.reattribute(x.addr(), categories[rng.range(0, 6) as usize]);
                }
                95..=96 => sim.complete_all_events(),
                _ => {
                    a.empty_cache().unwrap();
                }
            }
            if step % 500 == 0 {
                assert_sums_exact(&a, &a.memory_history());
            }
        }
        let h = a.memory_history();
        assert_sums_exact(&a, &h);
        if ring < 1000 {
            assert!(h.dropped > 0 && h.events.len() == ring, "seed {seed}");
        }
        for x in live {
            a.free_raw(x).unwrap();
        }
        sim.complete_all_events();
        a.empty_cache().unwrap();
        assert_sums_exact(&a, &a.memory_history());
        a.check_invariants().unwrap();
    }
}

#[test]
fn peak_and_largest_blocks_at_the_peak() {
    let (_, a) = sim_alloc(1 << 30, false);
    a.record_memory_history(true, 1000).unwrap();
    let p = {
        let _c = AllocContext::category(MemoryCategory::Parameter);
        a.allocate_raw(4 * MIB, S0).unwrap()
    };
    let t = {
        let _c = AllocContext::category(MemoryCategory::Temporary);
        a.allocate_raw(2 * MIB, S0).unwrap()
    };
    a.free_raw(t).unwrap();
    let h = a.memory_history();
    let (at, bytes) = h.peak().unwrap();
    assert_eq!(h.events[at].allocated_after, 6 * MIB);
    assert_eq!(bytes.get(MemoryCategory::Temporary), 2 * MIB);
    let top = h.live_at(at);
    assert_eq!((top[0].address, top[0].size), (p.addr(), 4 * MIB));
    assert_eq!(top[1].size, 2 * MIB);
    assert_eq!(h.max_by_category().get(MemoryCategory::Parameter), 4 * MIB);
    a.free_raw(p).unwrap();
}

#[test]
fn the_oom_report_names_what_filled_the_device_and_the_plan() {
    let (_, a) = sim_alloc(64 * MIB, false);
    let keep = a.allocate_raw(40 * MIB, S0).unwrap();
    let err = a.allocate_raw(30 * MIB, S0).unwrap_err().to_string();
    assert!(err.contains("record the allocation history"), "{err}");
    a.free_raw(keep).unwrap();

    a.record_memory_history(true, 1000).unwrap();
    let weights = {
        let _p = AllocContext::category(MemoryCategory::Parameter);
        let _m = AllocContext::module("layer4.0.conv2");
        a.allocate_raw(36 * MIB, S0).unwrap()
    };
    let acts = {
        let _m = AllocContext::module("fc");
        let _op = AllocContext::op("Mm", MemoryCategory::Activation);
        a.allocate_raw(12 * MIB, S0).unwrap()
    };
    a.set_plan_prediction(Some(PlanPrediction {
        label: "AdamW step, batch 64".into(),
        peak_allocated: 50 * MIB,
        by_category: vec![(MemoryCategory::Parameter, 36 * MIB)],
    }));
    let Err(Error::OutOfMemory(report)) = a.allocate_raw(30 * MIB, S0) else {
        panic!("expected an out-of-memory error");
    };
    assert!(report.history_recorded);
    let top: Vec<_> = report
        .top_live
        .iter()
        .map(|b| (b.size, b.attribution.category_or_unknown()))
        .collect();
    assert_eq!(
        top,
        [
            (36 * MIB, MemoryCategory::Parameter),
            (12 * MIB, MemoryCategory::Activation)
        ]
    );
    let text = report.to_string();
    assert!(
        text.contains("36.00 MiB parameter op - module layer4.0.conv2"),
        "{text}"
    );
    assert!(
        text.contains("12.00 MiB activation op Mm module fc"),
        "{text}"
    );
    assert!(
        text.contains("the memory plan (AdamW step, batch 64) predicted a peak of 50.00 MiB"),
        "{text}"
    );
    assert_eq!(
        a.plan_prediction()
            .unwrap()
            .category_bytes(MemoryCategory::Parameter),
        Some(36 * MIB)
    );
    a.free_raw(weights).unwrap();
    a.free_raw(acts).unwrap();
}
