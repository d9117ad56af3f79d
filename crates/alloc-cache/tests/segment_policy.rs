//! The fixed-segment policies that beat PyTorch's rules on fragmentation: defragmentation on a
//! miss and geometric growth of large segments (design notes at the top of `allocator.rs`).

use kiln_alloc_cache::*;
use std::sync::Arc;

const MIB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

fn sim_alloc(config: AllocatorConfig) -> (Arc<SimBackend>, CachingAllocator) {
    let sim = Arc::new(SimBackend::new(1 << 30).with_page_granularity(2 * MIB));
    let a = CachingAllocator::new(Arc::clone(&sim), config).unwrap();
    (sim, a)
}

fn with_max_split(mib: usize) -> AllocatorConfig {
    AllocatorConfig {
        max_split_size: Some(mib * MIB),
        ..AllocatorConfig::default()
    }
}

/// Three 12 MiB segments, all freed, then a 30 MiB request: the statistics after it and the
/// request's block size.
fn three_free_segments_then_30_mib(config: AllocatorConfig) -> (MemoryStats, usize) {
    let (_sim, a) = sim_alloc(config);
    let xs: Vec<_> = (0..3)
        .map(|_| a.allocate_raw(12 * MIB, S0).unwrap())
        .collect();
    for x in xs {
        a.free_raw(x).unwrap();
    }
    let y = a.allocate_raw(30 * MIB, S0).unwrap();
    let (stats, size) = (a.memory_stats(), y.block_size());
    a.free_raw(y).unwrap();
    a.check_invariants().unwrap();
    (stats, size)
}

/// Reserved bytes after a 12 MiB request made with `reserved_mib` already reserved (one block).
fn reserved_after_12_mib(config: AllocatorConfig, reserved_mib: usize) -> i64 {
    let (_sim, a) = sim_alloc(config);
    let big = a.allocate_raw(reserved_mib * MIB, S0).unwrap();
    let x = a.allocate_raw(12 * MIB, S0).unwrap();
    let reserved = a.memory_stats().reserved_bytes.all.current;
    for r in [big, x] {
        a.free_raw(r).unwrap();
    }
    a.check_invariants().unwrap();
    reserved
}

#[test]
fn a_miss_merges_wholly_free_segments_instead_of_growing() {
    let (sim, a) = sim_alloc(AllocatorConfig::default());
    let xs: Vec<_> = (0..3)
        .map(|_| a.allocate_raw(12 * MIB, S0).unwrap())
        .collect();
    assert_eq!(
        a.memory_stats().num_device_alloc,
        3,
        "one 12 MiB segment each"
    );
    for x in xs {
        a.free_raw(x).unwrap();
    }
    // 36 MiB cached in three 12 MiB segments, none of which fits 30 MiB.
    let y = a.allocate_raw(30 * MIB, S0).unwrap();
    let s = a.memory_stats();
    assert_eq!((s.num_device_free, s.num_device_alloc), (3, 4));
    assert_eq!(
        s.reserved_bytes.all.current,
        36 * MIB as i64,
        "did not grow"
    );
    assert_eq!(s.reserved_bytes.all.peak, 36 * MIB as i64);
    assert_eq!(s.segment.all.current, 1);
    assert_eq!(y.block_size(), 30 * MIB);
    assert_eq!(a.largest_free_block(), 6 * MIB, "the rest stays cached");
    assert_eq!(sim.used_bytes(), 36 * MIB);
    a.check_invariants().unwrap();
    // The merged segment serves the next 30 MiB request of a repeated step: no backend call.
    a.free_raw(y).unwrap();
    let calls = sim.calls();
    let y = a.allocate_raw(30 * MIB, S0).unwrap();
    assert_eq!(sim.calls(), calls);
    a.free_raw(y).unwrap();
    assert_eq!(a.empty_cache().unwrap(), 36 * MIB);
    assert_eq!(sim.live_ranges(), (0, 0, 0));
}

#[test]
fn merging_leaves_partly_used_segments_and_other_streams_alone() {
    let (_sim, a) = sim_alloc(AllocatorConfig::default());
    let s1 = StreamId(1);
    let x = a.allocate_raw(12 * MIB, S0).unwrap();
    let kept = a.allocate_raw(12 * MIB, S0).unwrap();
    let other = a.allocate_raw(12 * MIB, s1).unwrap();
    a.free_raw(x).unwrap();
    a.free_raw(other).unwrap();
    // Only 12 MiB wholly free on stream 0 (the other stream's segment is not ours): a new
    // segment, nothing released.
    let y = a.allocate_raw(20 * MIB, S0).unwrap();
    let s = a.memory_stats();
    assert_eq!((s.num_device_free, s.num_device_alloc), (0, 4));
    assert_eq!(s.reserved_bytes.all.current, 56 * MIB as i64);
    for r in [kept, y] {
        a.free_raw(r).unwrap();
    }
    a.check_invariants().unwrap();
}

#[test]
fn merging_respects_max_split_size() {
    // A merged 36 MiB block could never be split for this 30 MiB request's successors, so the
    // segments stay as they are and a fresh one is made.
    let (s, size) = three_free_segments_then_30_mib(with_max_split(32));
    assert_eq!((s.num_device_free, s.num_device_alloc), (0, 4));
    assert_eq!(size, 30 * MIB);
}

#[test]
fn large_segments_hold_the_copies_of_a_request_that_fit_a_sixteenth_of_the_pool() {
    let (sim, a) = sim_alloc(AllocatorConfig::default());
    let big = a.allocate_raw(320 * MIB, S0).unwrap();
    assert_eq!(
        a.memory_stats().reserved_bytes.all.current,
        320 * MIB as i64
    );
    // 10 MiB would get a 10 MiB segment; two copies fit 320 MiB / GROWTH_DIVISOR = 20 MiB.
    assert_eq!(GROWTH_DIVISOR, 16);
    let x = a.allocate_raw(10 * MIB, S0).unwrap();
    assert_eq!(
        a.memory_stats().reserved_bytes.all.current,
        340 * MIB as i64
    );
    let calls = sim.calls();
    let y = a.allocate_raw(10 * MIB, S0).unwrap();
    assert_eq!(
        sim.calls(),
        calls,
        "the second 10 MiB fits the same segment"
    );
    assert_eq!(y.addr(), x.addr() + 10 * MIB as u64);
    // 12 MiB fits only once in 340 MiB / 16 = 21.25 MiB: a segment of its own size, since a
    // larger one would end in a tail no 12 MiB request could use.
    let w = a.allocate_raw(12 * MIB, S0).unwrap();
    assert_eq!(
        a.memory_stats().reserved_bytes.all.current,
        352 * MIB as i64
    );
    // Requests below 10 MiB keep the 20 MiB segment, whatever is reserved.
    let z = a.allocate_raw(2 * MIB, S0).unwrap();
    assert_eq!(
        a.memory_stats().reserved_bytes.all.current,
        372 * MIB as i64
    );
    for r in [big, x, y, w, z] {
        a.free_raw(r).unwrap();
    }
    a.check_invariants().unwrap();
}

#[test]
fn growth_stays_below_max_split_size() {
    // Three 12 MiB copies (36 MiB of 640 / 16 = 40 MiB) would make a block that max_split_size
    // forbids splitting.
    assert_eq!(
        reserved_after_12_mib(with_max_split(24), 640),
        652 * MIB as i64
    );
}

#[test]
fn a_request_that_rounding_would_waste_gets_a_segment_for_two() {
    let (sim, a) = sim_alloc(AllocatorConfig::default());
    let big = a.allocate_raw(320 * MIB, S0).unwrap();
    // 12.25 MiB alone would take a 14 MiB segment (1.75 MiB, 14%, lost); one copy fits
    // 320 / 16 = 20 MiB, but two are made room for: 24.5 MiB in 26 MiB.
    let x = a.allocate_raw(12 * MIB + MIB / 4, S0).unwrap();
    assert_eq!(
        a.memory_stats().reserved_bytes.all.current,
        346 * MIB as i64
    );
    let calls = sim.calls();
    let y = a.allocate_raw(12 * MIB + MIB / 4, S0).unwrap();
    assert_eq!(sim.calls(), calls, "the second copy is a hit");
    assert_eq!(y.addr(), x.addr() + (12 * MIB + MIB / 4) as u64);
    // Above 1/8 of the pool (346 MiB / 8 = 43.25 MiB) no pair is made, however wasteful the
    // rounding: 44.25 MiB gets its own 46 MiB segment.
    let z = a.allocate_raw(44 * MIB + MIB / 4, S0).unwrap();
    assert_eq!(
        a.memory_stats().reserved_bytes.all.current,
        392 * MIB as i64
    );
    for r in [big, x, y, z] {
        a.free_raw(r).unwrap();
    }
    a.check_invariants().unwrap();
}

/// Each `max_split_size` rule at its exact boundary, where PyTorch's comparisons are `>=`: a
/// cached block of exactly `max_split_size` is oversize (not cut for a smaller request); a
/// request of exactly `max_split_size` is oversize too, and an oversize request does not take a
/// block exactly 20 MiB larger; wholly free segments that would merge into exactly
/// `max_split_size` are not merged for a smaller request; growth never makes a segment of
/// exactly `max_split_size`.
#[test]
fn max_split_size_rules_hold_at_their_exact_boundaries() {
    let limit = with_max_split;
    // A block of exactly max_split_size is not cut for a smaller request.
    let (_sim, a) = sim_alloc(limit(40));
    let block = a.allocate_raw(40 * MIB, S0).unwrap();
    let addr = block.addr();
    a.free_raw(block).unwrap();
    let small = a.allocate_raw(10 * MIB, S0).unwrap();
    assert_ne!(
        small.addr(),
        addr,
        "a 40 MiB block is oversize at max_split_size 40 MiB"
    );
    a.free_raw(small).unwrap();
    a.check_invariants().unwrap();

    // A request of exactly max_split_size does not take a block 20 MiB larger; one 512 bytes
    // larger does.
    for (request, reused) in [(40 * MIB, false), (40 * MIB + 512, true)] {
        let (_sim, a) = sim_alloc(limit(40));
        let block = a.allocate_raw(60 * MIB, S0).unwrap();
        let addr = block.addr();
        a.free_raw(block).unwrap();
        let x = a.allocate_raw(request, S0).unwrap();
        assert_eq!(
            x.addr() == addr,
            reused,
            "{request} bytes from a 60 MiB block"
        );
        a.free_raw(x).unwrap();
        a.check_invariants().unwrap();
    }

    // Three free 12 MiB segments would merge into exactly max_split_size (36 MiB): not for a
    // 30 MiB request, which gets a segment of its own.
    let (s, _) = three_free_segments_then_30_mib(limit(36));
    assert_eq!((s.num_device_free, s.num_device_alloc), (0, 4), "no merge");

    // With 400 MiB reserved, two 12 MiB copies fit 400 / 16 = 25 MiB, but a 24 MiB segment
    // would be exactly max_split_size: the segment holds one copy.
    assert_eq!(reserved_after_12_mib(limit(24), 400), 412 * MIB as i64);
}
