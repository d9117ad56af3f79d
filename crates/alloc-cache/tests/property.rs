//! Property tests: seeded random alloc/free/record_stream/trim sequences on `SimBackend`, with
//! every invariant checked after every step.
//!
//! Asserted: no two live blocks overlap; the kept statistics equal a recomputation from the
//! blocks (`check_invariants`); an allocation never fails while a free block of its stream fits
//! it (and is backed by memory: `empty_cache` may have unmapped pages of expandable segments); after everything is freed, `empty_cache` returns all memory to the backend.

use kiln_alloc_cache::synth::SplitMix64;
use kiln_alloc_cache::*;
use std::sync::Arc;

const MIB: usize = 1 << 20;

fn random_size(rng: &mut SplitMix64) -> usize {
    match rng.range(0, 9) {
        0..=5 => rng.range(0, MIB as u64) as usize,
        6..=8 => rng.range(MIB as u64, 10 * MIB as u64) as usize,
        _ => rng.range(10 * MIB as u64, 48 * MIB as u64) as usize,
    }
}

fn fitting_free_block_exists(a: &CachingAllocator, stream: StreamId, rounded: usize) -> bool {
    a.snapshot()
        .segments
        .iter()
        .filter(|s| s.stream == stream)
        .any(|s| {
            s.blocks.iter().any(|b| {
                b.state == BlockSnapshotState::Inactive && b.size >= rounded && b.fully_mapped
            })
        })
}

fn no_overlap(live: &[RawAllocation]) {
    let mut spans: Vec<(u64, u64)> = live
        .iter()
        .map(|r| (r.addr(), r.addr() + r.block_size() as u64))
        .collect();
    spans.sort();
    for w in spans.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "live blocks overlap: {:#x?} and {:#x?}",
            w[0],
            w[1]
        );
    }
}

fn run(seed: u64, config: AllocatorConfig, capacity: usize, steps: usize) {
    let sim = Arc::new(SimBackend::new(capacity).with_page_granularity(2 * MIB));
    let a = CachingAllocator::new(Arc::clone(&sim), config.clone()).unwrap();
    let mut rng = SplitMix64(seed);
    let streams = [StreamId(0), StreamId(1)];
    let mut live: Vec<RawAllocation> = Vec::new();
    let mut ooms = 0;
    for step in 0..steps {
        let ctx = || format!("seed {seed}, step {step}, config {config:?}");
        match rng.range(0, 99) {
            0..=54 => {
                let size = random_size(&mut rng);
                let stream = streams[rng.range(0, 1) as usize];
                let fit_before = fitting_free_block_exists(&a, stream, config.rounded_size(size));
                match a.allocate_raw(size, stream) {
                    Ok(r) => {
                        assert!(r.block_size() >= size && r.addr() % 512 == 0, "{}", ctx());
                        live.push(r);
                    }
                    Err(Error::OutOfMemory(report)) => {
                        ooms += 1;
                        assert!(
                            !fit_before,
                            "OOM although a fitting free block existed ({}):\n{report}",
                            ctx()
                        );
                    }
                    Err(e) => panic!("{}: {e}", ctx()),
                }
            }
            55..=94 if !live.is_empty() => {
                let r = live.swap_remove(rng.range(0, live.len() as u64 - 1) as usize);
                if rng.range(0, 9) == 0 {
                    a.record_stream(&r, streams[1 - (r.stream().0 as usize)])
                        .unwrap();
                }
                a.free_raw(r).unwrap();
            }
            95..=96 => sim.complete_all_events(),
            97 => {
                let target = rng.range(0, capacity as u64 / 2) as usize;
                let before = a.memory_stats().reserved_bytes.all.current as usize;
                let released = a.trim_to(target).unwrap();
                let after = a.memory_stats().reserved_bytes.all.current as usize;
                assert_eq!(before - after, released, "{}", ctx());
            }
            98 => {
                let released = a.empty_cache().unwrap();
                let s = a.memory_stats();
                assert_eq!(
                    s.active.all.current as usize,
                    live.len(),
                    "empty_cache waited on all events"
                );
                assert!(released <= capacity);
            }
            _ => {}
        }
        if let Err(e) = a.check_invariants() {
            panic!("{}: {e}", ctx());
        }
        no_overlap(&live);
        let s = a.memory_stats();
        assert_eq!(s.allocation.all.current as usize, live.len(), "{}", ctx());
        let requested: usize = live.iter().map(|r| r.size()).sum();
        assert_eq!(
            s.requested_bytes.all.current as usize,
            requested,
            "{}",
            ctx()
        );
        assert_eq!(
            sim.used_bytes(),
            s.reserved_bytes.all.current as usize,
            "{}",
            ctx()
        );
    }
    for r in live.drain(..) {
        a.free_raw(r).unwrap();
    }
    let reserved = a.memory_stats().reserved_bytes.all.current as usize;
    assert_eq!(
        a.empty_cache().unwrap(),
        reserved,
        "seed {seed}: everything comes back"
    );
    let s = a.memory_stats();
    assert_eq!(
        (
            s.reserved_bytes.all.current,
            s.segment.all.current,
            s.active.all.current
        ),
        (0, 0, 0)
    );
    assert_eq!(sim.live_ranges(), (0, 0, 0), "seed {seed}");
    assert!(sim.live_events().is_empty());
    a.check_invariants().unwrap();
    // Tight capacities must actually exercise the OOM path.
    if capacity <= 128 * MIB {
        assert!(
            ooms > 0 || s.num_alloc_retries > 0,
            "seed {seed}: capacity never reached"
        );
    }
}

#[test]
fn random_sequences_default_mode() {
    for seed in 0..8 {
        run(seed, AllocatorConfig::default(), 128 * MIB, 2000);
    }
}

#[test]
fn random_sequences_expandable_mode() {
    for seed in 100..108 {
        run(seed, AllocatorConfig::expandable(), 128 * MIB, 2000);
    }
    let stitching = AllocatorConfig {
        page_stitching: true,
        ..AllocatorConfig::expandable()
    };
    for seed in 150..158 {
        run(seed, stitching.clone(), 128 * MIB, 2000);
    }
}

#[test]
fn random_sequences_with_max_split_gc_and_power2_rounding() {
    let config = AllocatorConfig {
        max_split_size: Some(24 * MIB),
        garbage_collection_threshold: Some(0.6),
        expandable_segments: false,
        roundup_power2_divisions: Some(4),
        page_stitching: false,
        planned_steps: false,
        host_page: None,
    };
    for seed in 200..208 {
        run(seed, config.clone(), 128 * MIB, 2000);
    }
    let expandable_gc = AllocatorConfig {
        garbage_collection_threshold: Some(0.6),
        ..AllocatorConfig::expandable()
    };
    for seed in 250..254 {
        run(seed, expandable_gc.clone(), 128 * MIB, 2000);
    }
}

#[test]
fn random_sequences_roomy_device() {
    for seed in 300..302 {
        run(seed, AllocatorConfig::default(), 1 << 40, 800);
        run(seed, AllocatorConfig::expandable(), 1 << 40, 800);
    }
}
