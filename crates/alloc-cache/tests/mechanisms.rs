//! One test per allocator mechanism, with exact expected numbers.

use kiln_alloc_cache::*;
use std::sync::Arc;

const MIB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

fn sim_alloc(capacity: usize, config: AllocatorConfig) -> (Arc<SimBackend>, CachingAllocator) {
    let sim = Arc::new(SimBackend::new(capacity).with_page_granularity(2 * MIB));
    let a = CachingAllocator::new(Arc::clone(&sim), config).unwrap();
    (sim, a)
}

fn ok(a: &CachingAllocator) {
    a.check_invariants().unwrap();
}

#[test]
fn rounding_pool_choice_and_segment_sizes() {
    assert_eq!(round_size(0), 512);
    assert_eq!(round_size(1), 512);
    assert_eq!(round_size(512), 512);
    assert_eq!(round_size(513), 1024);
    assert_eq!(SMALL_SIZE, 256 << 10);
    assert_eq!(pool_for(SMALL_SIZE), PoolKind::Small);
    assert_eq!(pool_for(SMALL_SIZE + 512), PoolKind::Large);
    assert_eq!(segment_size_for(512), 2 * MIB);
    assert_eq!(segment_size_for(SMALL_SIZE), 2 * MIB);
    assert_eq!(segment_size_for(SMALL_SIZE + 512), 20 * MIB);
    assert_eq!(segment_size_for(MIB), 20 * MIB);
    assert_eq!(segment_size_for(10 * MIB - 512), 20 * MIB);
    assert_eq!(segment_size_for(10 * MIB), 10 * MIB);
    assert_eq!(segment_size_for(10 * MIB + 512), 12 * MIB);
}

#[test]
fn small_requests_split_a_small_segment_best_fit_lowest_address() {
    let (sim, a) = sim_alloc(1 << 30, AllocatorConfig::default());
    let x = a.allocate_raw(1000, S0).unwrap();
    assert_eq!((x.size(), x.block_size()), (1000, 1024));
    let y = a.allocate_raw(100, S0).unwrap();
    assert_eq!(
        y.addr(),
        x.addr() + 1024,
        "the remainder is split off and reused"
    );
    let s = a.memory_stats();
    assert_eq!(s.segment.small_pool.current, 1);
    assert_eq!(s.reserved_bytes.small_pool.current, 2 * MIB as i64);
    assert_eq!(s.allocated_bytes.small_pool.current, 1536);
    assert_eq!(s.requested_bytes.small_pool.current, 1100);
    assert_eq!(s.inactive_split.all.current, 1);
    assert_eq!(s.inactive_split_bytes.all.current, (2 * MIB - 1536) as i64);
    assert_eq!(sim.calls().reserve, 1);
    ok(&a);
    a.free_raw(x).unwrap();
    a.free_raw(y).unwrap();
    ok(&a);
}

#[test]
fn freed_neighbours_coalesce_into_one_block() {
    let (_sim, a) = sim_alloc(1 << 30, AllocatorConfig::default());
    let x = a.allocate_raw(4096, S0).unwrap();
    let y = a.allocate_raw(4096, S0).unwrap();
    let z = a.allocate_raw(4096, S0).unwrap();
    let base = x.addr();
    a.free_raw(x).unwrap();
    a.free_raw(z).unwrap();
    let s = a.memory_stats();
    assert_eq!(
        s.inactive_split.all.current, 2,
        "x alone, z merged with the tail"
    );
    assert_eq!(a.largest_free_block(), 2 * MIB - 8192);
    a.free_raw(y).unwrap();
    let s = a.memory_stats();
    assert_eq!(s.inactive_split.all.current, 0);
    assert_eq!(s.inactive_split_bytes.all.current, 0);
    assert_eq!(a.largest_free_block(), 2 * MIB);
    let snap = a.snapshot();
    assert_eq!(snap.segments.len(), 1);
    assert_eq!(snap.segments[0].blocks.len(), 1);
    assert_eq!(snap.segments[0].blocks[0].address, base);
    ok(&a);
    assert_eq!(a.empty_cache().unwrap(), 2 * MIB);
}

#[test]
fn small_and_large_pools_use_separate_segments() {
    let (sim, a) = sim_alloc(1 << 30, AllocatorConfig::default());
    let small = a.allocate_raw(SMALL_SIZE, S0).unwrap();
    let big = a.allocate_raw(11 * MIB + 100, S0).unwrap();
    let medium = a.allocate_raw(5 * MIB, S0).unwrap();
    let s = a.memory_stats();
    assert_eq!(s.segment.small_pool.current, 1);
    assert_eq!(s.segment.large_pool.current, 2);
    assert_eq!(s.reserved_bytes.small_pool.current, 2 * MIB as i64);
    assert_eq!(s.reserved_bytes.large_pool.current, (20 + 12) * MIB as i64);
    // 5 MiB in a 20 MiB segment: the 15 MiB tail is split off.
    assert_eq!(medium.block_size(), 5 * MIB);
    // 11 MiB + 100 -> 12 MiB segment; the 1 MiB - 512 B remainder is more than SMALL_SIZE, so
    // it is split off.
    assert_eq!(big.block_size(), 11 * MIB + 512);
    assert_eq!(sim.calls().reserve, 3);
    let medium2 = a.allocate_raw(5 * MIB, S0).unwrap();
    assert_eq!(medium2.addr(), medium.addr() + 5 * MIB as u64);
    assert_eq!(sim.calls().reserve, 3, "served from the 20 MiB segment");
    for r in [small, medium, big, medium2] {
        a.free_raw(r).unwrap();
    }
    ok(&a);
    assert_eq!(a.empty_cache().unwrap(), 34 * MIB);
    assert_eq!(sim.live_ranges(), (0, 0, 0));
}

#[test]
fn max_split_size_keeps_oversize_blocks_whole() {
    let config = AllocatorConfig {
        max_split_size: Some(40 * MIB),
        ..Default::default()
    };
    let (sim, a) = sim_alloc(1 << 30, config);
    let big = a.allocate_raw(60 * MIB, S0).unwrap();
    let big_addr = big.addr();
    a.free_raw(big).unwrap();
    let small = a.allocate_raw(10 * MIB, S0).unwrap();
    assert_ne!(
        small.addr(),
        big_addr,
        "an oversize block is not cut for a smaller request"
    );
    assert_eq!(sim.calls().reserve, 2);
    let near = a.allocate_raw(50 * MIB, S0).unwrap();
    assert_eq!(near.addr(), big_addr, "60 MiB < 50 MiB + 20 MiB: reused");
    assert_eq!(near.block_size(), 60 * MIB, "and not split");
    a.free_raw(near).unwrap();
    let far = a.allocate_raw(39 * MIB, S0).unwrap();
    assert_ne!(
        far.addr(),
        big_addr,
        "below max_split_size: oversize blocks are off limits"
    );
    let exact = a.allocate_raw(41 * MIB, S0).unwrap();
    assert_eq!(exact.addr(), big_addr, "60 MiB < 41 MiB + 20 MiB: reused");
    assert_eq!(a.memory_stats().max_split_size, 40 * MIB as i64);
    for r in [small, far, exact] {
        a.free_raw(r).unwrap();
    }
    ok(&a);
}

#[test]
fn oom_releases_cache_and_retries() {
    let (sim, a) = sim_alloc(30 * MIB, AllocatorConfig::default());
    let x = a.allocate_raw(12 * MIB, S0).unwrap();
    a.free_raw(x).unwrap();
    let y = a.allocate_raw(20 * MIB, S0).unwrap();
    let s = a.memory_stats();
    assert_eq!(s.num_alloc_retries, 1);
    assert_eq!(s.num_ooms, 0);
    assert_eq!(s.num_device_free, 1);
    assert_eq!(s.reserved_bytes.all.current, 20 * MIB as i64);
    assert_eq!(
        sim.calls().reserve,
        3,
        "12 MiB, failed 20 MiB, retried 20 MiB"
    );
    a.free_raw(y).unwrap();
    ok(&a);
}

#[test]
fn padded_segment_falls_back_to_exact_size() {
    let (_sim, a) = sim_alloc(30 * MIB, AllocatorConfig::default());
    let x = a.allocate_raw(25 * MIB, S0).unwrap();
    // 26 MiB reserved; a 20 MiB segment does not fit, a 4 MiB one (3 MiB in whole pages) does.
    let y = a.allocate_raw(3 * MIB, S0).unwrap();
    assert_eq!(
        y.block_size(),
        3 * MIB,
        "the 1 MiB remainder is more than SMALL_SIZE and split off"
    );
    assert_eq!(a.memory_stats().reserved_bytes.all.current, 30 * MIB as i64);
    assert_eq!(a.memory_stats().num_alloc_retries, 0);
    a.free_raw(x).unwrap();
    a.free_raw(y).unwrap();
}

#[test]
fn oom_report_states_every_figure_and_advice() {
    let (_sim, a) = sim_alloc(10 * MIB, AllocatorConfig::default());
    let x = a.allocate_raw(8 * MIB, S0).unwrap();
    let err = a.allocate_raw(4 * MIB, S0).unwrap_err();
    let Error::OutOfMemory(report) = &err else {
        panic!("expected OOM, got {err:?}")
    };
    assert_eq!(report.requested, 4 * MIB);
    assert_eq!(report.capacity, 10 * MIB);
    assert_eq!(report.backend_free, 2 * MIB);
    assert_eq!(report.allocated, 8 * MIB);
    assert_eq!(report.reserved, 8 * MIB);
    assert_eq!(report.reserved_unallocated, 0);
    assert_eq!(report.largest_free_block, 0);
    let msg = err.to_string();
    for needle in [
        "tried to allocate 4.00 MiB (4194304 bytes)",
        "capacity 10.00 MiB (10485760 bytes)",
        "free 2.00 MiB (2097152 bytes)",
        "allocated 8.00 MiB",
        "reserved 8.00 MiB",
        "reserved but unallocated 0 B",
        "largest free block 0 B",
        "fragmentation 0.0%",
        "advice: live tensors use the device: reduce the batch size",
    ] {
        assert!(msg.contains(needle), "`{needle}` missing from:\n{msg}");
    }
    assert_eq!(a.memory_stats().num_ooms, 1);
    a.free_raw(x).unwrap();
    ok(&a);
}

#[test]
fn oom_from_fragmentation_advises_expandable_segments() {
    let (_sim, a) = sim_alloc(24 * MIB, AllocatorConfig::default());
    // Two 6 MiB blocks in one 18 MiB segment (three copies), the first freed: 12 MiB free in
    // two pieces; 9 MiB then needs a 10 MiB segment, and 28 MiB exceed the 24 MiB device.
    let x = a.allocate_raw(6 * MIB, S0).unwrap();
    let y = a.allocate_raw(6 * MIB, S0).unwrap();
    a.free_raw(x).unwrap();
    let err = a.allocate_raw(9 * MIB, S0).unwrap_err();
    let Error::OutOfMemory(report) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(report.reserved_unallocated, 12 * MIB);
    assert_eq!(report.largest_free_block, 6 * MIB);
    assert!((report.fragmentation - 0.5).abs() < 1e-12);
    assert!(
        err.to_string().contains("turn on expandable segments"),
        "{err}"
    );
    a.free_raw(y).unwrap();
}

#[test]
fn never_fails_while_a_fitting_free_block_exists() {
    let config = AllocatorConfig {
        max_split_size: Some(40 * MIB),
        ..Default::default()
    };
    let (_sim, a) = sim_alloc(60 * MIB, config);
    let big = a.allocate_raw(60 * MIB, S0).unwrap();
    let addr = big.addr();
    a.free_raw(big).unwrap();
    // The oversize rule rejects the 60 MiB block, the backend has nothing left; the cached
    // block must still be used rather than failing.
    let x = a.allocate_raw(10 * MIB, S0).unwrap();
    assert_eq!(x.addr(), addr);
    let s = a.memory_stats();
    assert_eq!((s.num_ooms, s.num_alloc_retries), (0, 0));
    // A small request may take a large-pool block as the last resort too.
    let y = a.allocate_raw(1000, S0).unwrap();
    assert_eq!(
        y.addr(),
        addr + 10 * MIB as u64,
        "taken from the large segment's tail"
    );
    a.free_raw(x).unwrap();
    a.free_raw(y).unwrap();
    ok(&a);
}

#[test]
fn blocks_stay_on_their_stream_and_wait_for_recorded_streams() {
    let (sim, a) = sim_alloc(1 << 30, AllocatorConfig::default());
    let (s1, s2) = (StreamId(1), StreamId(2));
    let x = a.allocate_raw(4096, s1).unwrap();
    let x_addr = x.addr();
    a.free_raw(x).unwrap();
    let other = a.allocate_raw(4096, s2).unwrap();
    assert_ne!(
        other.addr(),
        x_addr,
        "a free block of stream 1 is not given to stream 2"
    );
    assert_eq!(a.memory_stats().segment.all.current, 2);
    a.free_raw(other).unwrap();

    let x = a.allocate_raw(4096, s1).unwrap();
    assert_eq!(x.addr(), x_addr);
    a.record_stream(&x, s2).unwrap();
    a.free_raw(x).unwrap();
    let s = a.memory_stats();
    assert_eq!((s.allocation.all.current, s.active.all.current), (0, 1));
    assert_eq!(sim.live_events().len(), 1);
    let y = a.allocate_raw(4096, s1).unwrap();
    assert_ne!(y.addr(), x_addr, "not reused before the event completes");
    ok(&a);
    sim.complete_all_events();
    let z = a.allocate_raw(4096, s1).unwrap();
    assert_eq!(z.addr(), x_addr, "reused once stream 2's work is done");
    assert!(sim.live_events().is_empty());
    assert_eq!(
        a.memory_stats().num_sync_all_streams,
        0,
        "freeing never synchronises"
    );
    a.free_raw(y).unwrap();
    // z took x's block again: x's other stream does not outlive x, so z's free waits for none.
    a.free_raw(z).unwrap();
    assert!(sim.live_events().is_empty(), "z was never used on stream 2");
    assert_eq!(a.memory_stats().active.all.current, 0);
    ok(&a);
}

#[test]
fn empty_cache_waits_for_pending_blocks_and_returns_bytes() {
    let (sim, a) = sim_alloc(1 << 30, AllocatorConfig::default());
    let x = a.allocate_raw(4096, S0).unwrap();
    a.record_stream(&x, StreamId(7)).unwrap();
    a.free_raw(x).unwrap();
    assert_eq!(a.empty_cache().unwrap(), 2 * MIB);
    let s = a.memory_stats();
    assert_eq!(s.num_sync_all_streams, 1);
    assert_eq!((s.active.all.current, s.reserved_bytes.all.current), (0, 0));
    assert_eq!(sim.calls().synchronize_event, 1);
    assert_eq!(sim.live_ranges(), (0, 0, 0));
}

#[test]
fn trim_to_releases_largest_first_until_under_target() {
    let (_sim, a) = sim_alloc(1 << 30, AllocatorConfig::default());
    let xs = [
        a.allocate_raw(4096, S0).unwrap(),
        a.allocate_raw(12 * MIB, S0).unwrap(),
        a.allocate_raw(5 * MIB, S0).unwrap(),
    ];
    for x in xs {
        a.free_raw(x).unwrap();
    }
    assert_eq!(a.memory_stats().reserved_bytes.all.current, 34 * MIB as i64);
    assert_eq!(a.trim_to(15 * MIB).unwrap(), 20 * MIB);
    assert_eq!(a.memory_stats().reserved_bytes.all.current, 14 * MIB as i64);
    assert_eq!(a.trim_to(0).unwrap(), 14 * MIB);
    assert_eq!(a.trim_to(0).unwrap(), 0);
}

#[test]
fn garbage_collection_releases_oldest_free_segments_first() {
    let config = AllocatorConfig {
        garbage_collection_threshold: Some(0.5),
        ..Default::default()
    };
    let (_sim, a) = sim_alloc(100 * MIB, config);
    let old = a.allocate_raw(30 * MIB, S0).unwrap();
    let newer = a.allocate_raw(12 * MIB, S0).unwrap();
    a.free_raw(old).unwrap();
    a.free_raw(newer).unwrap();
    // 42 MiB cached, nothing fits 35 MiB; its 36 MiB segment would reach 78 MiB > 50 MiB:
    // release the oldest (30 MiB), which is enough (12 + 36 <= 50), and keep the newer one.
    let x = a.allocate_raw(35 * MIB, S0).unwrap();
    let s = a.memory_stats();
    assert_eq!(s.reserved_bytes.all.current, (12 + 36) * MIB as i64);
    assert_eq!((s.num_device_free, s.num_alloc_retries), (1, 0));
    a.free_raw(x).unwrap();
    ok(&a);
}

#[test]
fn expandable_segments_grow_in_place_and_unmap_the_tail() {
    let (sim, a) = sim_alloc(1 << 30, AllocatorConfig::expandable());
    let x = a.allocate_raw(3 * MIB, S0).unwrap();
    let s = a.memory_stats();
    assert_eq!(
        s.reserved_bytes.all.current,
        4 * MIB as i64,
        "whole 2 MiB pages"
    );
    assert_eq!(s.segment.all.current, 1);
    let y = a.allocate_raw(3 * MIB, S0).unwrap();
    assert_eq!(
        y.addr(),
        x.addr() + 3 * MIB as u64,
        "contiguous in the same segment"
    );
    assert_eq!(a.memory_stats().reserved_bytes.all.current, 6 * MIB as i64);
    assert_eq!(sim.calls().map, 2);
    assert_eq!(sim.calls().reserve_address_space, 1);
    a.free_raw(y).unwrap();
    ok(&a);
    // The free tail [3 MiB, 6 MiB): only the page [4 MiB, 6 MiB) lies wholly inside it.
    assert_eq!(a.empty_cache().unwrap(), 2 * MIB);
    assert_eq!(a.memory_stats().reserved_bytes.all.current, 4 * MIB as i64);
    ok(&a);
    a.free_raw(x).unwrap();
    assert_eq!(a.empty_cache().unwrap(), 4 * MIB);
    let s = a.memory_stats();
    assert_eq!(
        (s.segment.all.current, s.reserved_bytes.all.current),
        (0, 0)
    );
    assert_eq!(sim.live_ranges(), (0, 0, 0));
    ok(&a);
}

#[test]
fn expandable_segments_reuse_the_free_tail_when_growing() {
    let (sim, a) = sim_alloc(1 << 30, AllocatorConfig::expandable());
    let x = a.allocate_raw(5 * MIB, S0).unwrap();
    let y = a.allocate_raw(MIB + 512, S0).unwrap();
    let z = a.allocate_raw(10 * MIB, S0).unwrap();
    // 5 + 1 MiB used of 6 mapped after two maps; z needs 10 MiB: tail ~0 -> map 10 MiB more
    assert_eq!(z.addr(), y.addr() + (MIB + 512) as u64);
    let mapped = a.memory_stats().reserved_bytes.all.current as usize;
    assert_eq!(mapped, 18 * MIB);
    a.free_raw(x).unwrap();
    let w = a.allocate_raw(4 * MIB, S0).unwrap();
    assert_eq!(
        w.addr(),
        y.addr() - 5 * MIB as u64,
        "the hole at the start is reused"
    );
    assert_eq!(sim.calls().map, 3);
    for r in [y, z, w] {
        a.free_raw(r).unwrap();
    }
    ok(&a);
}

#[test]
fn stats_arithmetic_and_peaks() {
    let (_sim, a) = sim_alloc(1 << 30, AllocatorConfig::default());
    let x = a.allocate_raw(1000, S0).unwrap();
    let y = a.allocate_raw(3 * MIB, S0).unwrap();
    a.free_raw(x).unwrap();
    let s = a.memory_stats();
    let alloc = s.allocation;
    assert_eq!(
        (
            alloc.all.current,
            alloc.all.peak,
            alloc.all.allocated,
            alloc.all.freed
        ),
        (1, 2, 2, 1)
    );
    assert_eq!(alloc.small_pool.freed, 1);
    assert_eq!(alloc.large_pool.current, 1);
    let bytes = s.allocated_bytes.all;
    assert_eq!(
        (bytes.current, bytes.peak),
        (3 * MIB as i64, 3 * MIB as i64 + 1024)
    );
    assert_eq!(s.requested_bytes.all.current, 3 * MIB as i64);
    assert_eq!(s.requested_bytes.all.peak, 3 * MIB as i64 + 1000);
    assert_eq!(s.num_device_alloc, 2);
    a.reset_peak_stats();
    assert_eq!(a.memory_stats().allocated_bytes.all.peak, 3 * MIB as i64);
    let flat = a.memory_stats().to_flat();
    assert_eq!(flat["allocated_bytes.all.current"], 3 * MIB as i64);
    assert_eq!(flat["segment.large_pool.current"], 1);
    assert_eq!(flat["max_split_size"], -1);
    assert_eq!(flat.len(), 9 * 3 * 4 + 6);
    let summary = a.memory_summary();
    for needle in [
        "Allocated memory",
        "from large pool",
        "Reserved segments",
        "3.00 MiB",
        "Alloc retries: 0",
    ] {
        assert!(summary.contains(needle), "`{needle}` missing:\n{summary}");
    }
    a.free_raw(y).unwrap();
    ok(&a);
}

#[test]
fn snapshot_serialises_segments_and_block_states() {
    let (_sim, a) = sim_alloc(1 << 30, AllocatorConfig::default());
    let x = a.allocate_raw(1000, S0).unwrap();
    let snap = a.snapshot();
    assert_eq!(snap.segments.len(), 1);
    let seg = &snap.segments[0];
    assert_eq!(
        (seg.total_size, seg.allocated_size, seg.requested_size),
        (2 * MIB, 1024, 1000)
    );
    assert_eq!(seg.blocks[0].state, BlockSnapshotState::ActiveAllocated);
    assert_eq!(seg.blocks[1].state, BlockSnapshotState::Inactive);
    let json: serde_json::Value = serde_json::from_str(&snap.to_json()).unwrap();
    assert_eq!(json["segments"][0]["segment_type"], "small");
    assert_eq!(
        json["segments"][0]["blocks"][0]["state"],
        "active_allocated"
    );
    assert_eq!(json["stats"]["allocated_bytes"]["all"]["current"], 1024);
    a.free_raw(x).unwrap();
}

#[test]
fn foreign_free_is_refused_with_a_fix() {
    let (_s1, a) = sim_alloc(1 << 30, AllocatorConfig::default());
    let (_s2, b) = sim_alloc(1 << 30, AllocatorConfig::default());
    let x = b.allocate_raw(4096, S0).unwrap();
    let _keep = a.allocate_raw(4096, S0).unwrap();
    let _keep2 = a.allocate_raw(4096, S0).unwrap();
    let err = a.free_raw(x).unwrap_err();
    assert!(matches!(err, Error::InvalidFree(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("free each allocation exactly once"),
        "{err}"
    );
    assert_eq!(a.memory_stats().allocation.all.current, 2);
}

#[test]
fn raii_handle_frees_on_drop_and_host_memory_is_usable() {
    let a =
        Arc::new(CachingAllocator::new(HostBackend::new(), AllocatorConfig::default()).unwrap());
    let h = a.allocate(3000, S0).unwrap();
    assert_eq!(h.addr() % 512, 0);
    // SAFETY: host backend, 3000 bytes owned by `h`.
    unsafe { std::ptr::write_bytes(h.as_ptr(), 0xAB, h.size()) };
    let addr = h.addr();
    drop(h);
    assert_eq!(a.memory_stats().allocation.all.current, 0);
    let again = a.allocate(2000, S0).unwrap();
    assert_eq!(again.addr(), addr, "the cached block is reused");
    let raw = again.into_raw();
    assert_eq!(a.memory_stats().allocation.all.current, 1);
    a.free_raw(raw).unwrap();
    assert_eq!(a.empty_cache().unwrap(), 2 * MIB);
}

#[test]
fn allocator_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<CachingAllocator>();
    check::<Allocation>();
}
