//! Stitched blocks (page stitching on a backend with alias mappings): a large request that fits
//! no free block reaches the whole free pages of its segment through a second mapping, and the
//! stitched block stays cached for the next miss of its size. Exact calls, bytes and physical
//! pages on hand-worked sequences, on the simulated backend (which numbers physical pages) and
//! on host memory (memfd pages, Linux).

use kiln_alloc_cache::*;
use std::sync::Arc;

const MIB: usize = 1 << 20;
const PAGE: usize = 2 * MIB;
const S0: StreamId = StreamId::DEFAULT;

fn stitching() -> AllocatorConfig {
    AllocatorConfig {
        page_stitching: true,
        ..AllocatorConfig::expandable()
    }
}

fn sim_alloc() -> (Arc<SimBackend>, CachingAllocator) {
    let sim = Arc::new(SimBackend::new(1 << 30).with_page_granularity(PAGE));
    let a = CachingAllocator::new(Arc::clone(&sim), stitching()).unwrap();
    (sim, a)
}

/// Four 4 MiB blocks A, B, C, D (offsets 0, 4, 8, 12 MiB of the large segment); A and C are
/// freed, leaving two 4 MiB gaps (two whole pages each) between live blocks. Returns the gaps'
/// addresses and the kept blocks B and D.
fn two_gaps(a: &CachingAllocator) -> ([u64; 2], Vec<RawAllocation>) {
    let mut blocks: Vec<_> = (0..4)
        .map(|_| a.allocate_raw(4 * MIB, S0).unwrap())
        .collect();
    let d = blocks.remove(3);
    let c = blocks.remove(2);
    let b = blocks.remove(1);
    let a0 = blocks.remove(0);
    let gaps = [a0.addr(), c.addr()];
    a.free_raw(a0).unwrap();
    a.free_raw(c).unwrap();
    (gaps, vec![b, d])
}

fn physical(sim: &SimBackend, addr: u64, bytes: usize) -> Vec<u64> {
    sim.physical_pages(addr, bytes).unwrap()
}

#[test]
fn a_request_fitting_no_gap_is_stitched_from_the_gaps_and_reused_without_calls() {
    let (sim, a) = sim_alloc();
    let (gaps, kept) = two_gaps(&a);
    assert_eq!(gaps[1], gaps[0] + 8 * MIB as u64);
    let gap_pages: Vec<u64> = gaps
        .iter()
        .flat_map(|&g| physical(&sim, g, 4 * MIB))
        .collect();
    let before = (sim.calls(), a.memory_stats());
    let big = a.allocate_raw(8 * MIB, S0).unwrap();
    let (calls, stats) = (sim.calls(), a.memory_stats());
    // One alias per gap and the alias space; no memory mapped, moved or given back.
    assert_eq!(calls.map_alias - before.0.map_alias, 2);
    assert_eq!(
        calls.reserve_address_space - before.0.reserve_address_space,
        1
    );
    assert_eq!(calls.map + calls.remap + calls.unmap, before.0.map);
    assert_eq!(stats.reserved_bytes.all.current, 16 * MIB as i64);
    assert_eq!(sim.used_bytes(), 16 * MIB);
    assert_eq!(stats.num_device_alloc, before.1.num_device_alloc);
    // It counts as an allocation of 8 MiB; its pages count nowhere else.
    assert_eq!(stats.allocated_bytes.all.current, 16 * MIB as i64);
    assert_eq!(stats.allocation.all.current, 3);
    assert_eq!(stats.inactive_split_bytes.all.current, 0);
    assert_eq!(big.block_size(), 8 * MIB);
    assert_eq!(physical(&sim, big.addr(), 8 * MIB), gap_pages);
    a.check_invariants().unwrap();
    // While it is in use the gaps are not free: a 4 MiB request maps two new pages after D.
    let other = a.allocate_raw(4 * MIB, S0).unwrap();
    assert_eq!(other.addr(), kept[1].addr() + 4 * MIB as u64);
    assert_eq!(a.memory_stats().reserved_bytes.all.current, 20 * MIB as i64);
    a.free_raw(other).unwrap();
    let big_addr = big.addr();
    a.free_raw(big).unwrap();
    let s = a.memory_stats();
    assert_eq!(
        (s.allocated_bytes.all.current, s.reserved_bytes.all.current),
        (8 * MIB as i64, 20 * MIB as i64)
    );
    a.check_invariants().unwrap();
    // The next 8 MiB miss takes the cached stitched block back: no backend call at all.
    let calls = sim.calls();
    let again = a.allocate_raw(8 * MIB, S0).unwrap();
    assert_eq!(sim.calls(), calls);
    assert_eq!(again.addr(), big_addr);
    a.check_invariants().unwrap();
    for r in kept.into_iter().chain([again]) {
        a.free_raw(r).unwrap();
    }
    // Giving everything back drops the stitched block's aliases first, then the space.
    let calls = sim.calls();
    assert_eq!(a.empty_cache().unwrap(), 20 * MIB);
    let after = sim.calls();
    assert_eq!(after.unmap_alias - calls.unmap_alias, 2);
    assert_eq!(after.release_address_space - calls.release_address_space, 2);
    assert_eq!(sim.live_ranges(), (0, 0, 0));
    a.check_invariants().unwrap();
}

#[test]
fn a_request_whose_page_rounding_wastes_over_a_sixteenth_grows_in_place() {
    let (sim, a) = sim_alloc();
    let (_, kept) = two_gaps(&a);
    let before = sim.calls();
    // 5 MiB would hold a 6 MiB stitched block with 1 MiB (1/6) unused: three pages past D.
    let r = a.allocate_raw(5 * MIB, S0).unwrap();
    let calls = sim.calls();
    assert_eq!(
        (calls.map - before.map, calls.map_alias - before.map_alias),
        (1, 0)
    );
    assert_eq!(r.addr(), kept[1].addr() + 4 * MIB as u64);
    assert_eq!(a.memory_stats().reserved_bytes.all.current, 22 * MIB as i64);
    // 7.5 MiB wastes 1/16 of 8 MiB exactly: stitched.
    let s = a.allocate_raw(7 * MIB + MIB / 2, S0).unwrap();
    assert_eq!(sim.calls().map_alias - calls.map_alias, 2);
    assert_eq!(s.block_size(), 8 * MIB);
    assert_eq!(a.memory_stats().reserved_bytes.all.current, 22 * MIB as i64);
    a.check_invariants().unwrap();
    for x in kept.into_iter().chain([r, s]) {
        a.free_raw(x).unwrap();
    }
}

#[test]
fn too_few_free_pages_are_topped_up_with_new_pages_past_the_end() {
    let (sim, a) = sim_alloc();
    let (gaps, kept) = two_gaps(&a);
    let gap_pages: Vec<u64> = gaps
        .iter()
        .flat_map(|&g| physical(&sim, g, 4 * MIB))
        .collect();
    let before = sim.calls();
    // 12 MiB: the gaps hold 4 of its 6 pages; 2 new pages beat 6 in place.
    let big = a.allocate_raw(12 * MIB, S0).unwrap();
    let calls = sim.calls();
    assert_eq!(
        (calls.map - before.map, calls.map_alias - before.map_alias),
        (1, 3)
    );
    assert_eq!(a.memory_stats().reserved_bytes.all.current, 20 * MIB as i64);
    let pages = physical(&sim, big.addr(), 12 * MIB);
    assert_eq!(pages[..4], gap_pages[..]);
    let tail = kept[1].addr() + 4 * MIB as u64;
    assert_eq!(pages[4..], physical(&sim, tail, 4 * MIB)[..]);
    a.check_invariants().unwrap();
    // A cached stitched block whose memory is partly taken is not handed out: with gap A in
    // use, the next 8 MiB miss stitches gap C with two new pages instead.
    a.free_raw(big).unwrap();
    let in_a = a.allocate_raw(4 * MIB, S0).unwrap();
    assert_eq!(in_a.addr(), gaps[0]);
    let calls = sim.calls();
    let eight = a.allocate_raw(8 * MIB, S0).unwrap();
    let after = sim.calls();
    assert_eq!(
        (after.map - calls.map, after.map_alias - calls.map_alias),
        (0, 2)
    );
    assert_eq!(
        physical(&sim, eight.addr(), 8 * MIB),
        [
            physical(&sim, gaps[1], 4 * MIB),
            physical(&sim, tail, 4 * MIB)
        ]
        .concat()
    );
    a.check_invariants().unwrap();
    for x in kept.into_iter().chain([in_a, eight]) {
        a.free_raw(x).unwrap();
    }
    a.empty_cache().unwrap();
    assert_eq!(sim.live_ranges(), (0, 0, 0));
}

#[test]
fn cached_stitched_blocks_go_before_their_pages_are_unmapped() {
    let (sim, a) = sim_alloc();
    let (_, kept) = two_gaps(&a);
    let big = a.allocate_raw(8 * MIB, S0).unwrap();
    a.free_raw(big).unwrap();
    // The simulated device refuses to unmap pages that still have an alias, so this only
    // succeeds if the cached stitched block is dropped first.
    let calls = sim.calls();
    assert_eq!(a.empty_cache().unwrap(), 8 * MIB);
    let after = sim.calls();
    assert_eq!(after.unmap_alias - calls.unmap_alias, 2);
    assert_eq!(after.unmap - calls.unmap, 2);
    assert_eq!(a.memory_stats().reserved_bytes.all.current, 8 * MIB as i64);
    // B and D stay mapped (4 pages) in the segment's reservation; the alias space is gone.
    assert_eq!(sim.live_ranges(), (0, 1, 4));
    a.check_invariants().unwrap();
    for x in kept {
        a.free_raw(x).unwrap();
    }
    // A stitched block in use keeps its memory through empty_cache, and teardown unmaps its
    // aliases before the memory.
    let (sim, a) = sim_alloc();
    let (_, kept) = two_gaps(&a);
    let big = a.allocate_raw(8 * MIB, S0).unwrap();
    assert_eq!(a.empty_cache().unwrap(), 0);
    assert_eq!(sim.calls().unmap_alias, 0);
    a.check_invariants().unwrap();
    drop((a, kept, big));
    assert_eq!(sim.live_ranges(), (0, 0, 0));
    assert_eq!(sim.calls().unmap_alias, 2);
}

#[test]
fn a_snapshot_shows_lent_pages_as_allocated_memory() {
    let (_, a) = sim_alloc();
    let (gaps, kept) = two_gaps(&a);
    let big = a.allocate_raw(8 * MIB, S0).unwrap();
    let snap = a.snapshot();
    let large = snap
        .segments
        .iter()
        .find(|s| s.segment_type == PoolKind::Large)
        .unwrap();
    let lent: Vec<_> = large
        .blocks
        .iter()
        .filter(|b| gaps.contains(&b.address))
        .map(|b| (b.size, b.state, b.requested_size))
        .collect();
    let allocated = (4 * MIB, BlockSnapshotState::ActiveAllocated, 0);
    assert_eq!(lent, [allocated, allocated]);
    assert_eq!(large.allocated_size, 16 * MIB);
    assert_eq!(large.total_size, 16 * MIB);
    for x in kept.into_iter().chain([big]) {
        a.free_raw(x).unwrap();
    }
}

/// Host memory (Linux), at the default page and at 2 MiB: the stitched block and the gaps are the same bytes.
#[cfg(target_os = "linux")]
#[test]
fn host_stitched_blocks_reach_the_gaps_memory() {
    for page in [DEFAULT_HOST_PAGE, 2 * MIB] {
        host_stitched_blocks_reach_the_gaps_memory_at(page);
    }
}

#[cfg(target_os = "linux")]
fn host_stitched_blocks_reach_the_gaps_memory_at(page: usize) {
    let host = HostBackend::with_capacity(64 * MIB)
        .with_page_mapping_of(page)
        .unwrap();
    let a = CachingAllocator::new(host, stitching()).unwrap();
    let (gaps, kept) = two_gaps(&a);
    let fill = |addr: u64, bytes: usize, byte: u8| {
        // SAFETY: callers pass live memory of this allocator.
        unsafe { std::ptr::write_bytes(addr as usize as *mut u8, byte, bytes) }
    };
    let holds = |addr: u64, bytes: usize, byte: u8| {
        // SAFETY: as above.
        let s = unsafe { std::slice::from_raw_parts(addr as usize as *const u8, bytes) };
        s.iter().all(|&b| b == byte)
    };
    for (i, r) in kept.iter().enumerate() {
        fill(r.addr(), r.block_size(), 0xa0 + i as u8);
    }
    let big = a.allocate_raw(8 * MIB, S0).unwrap();
    assert_eq!(a.memory_stats().reserved_bytes.all.current, 16 * MIB as i64);
    assert_eq!(a.backend().free_bytes(), 48 * MIB);
    fill(big.addr(), 4 * MIB, 0x5c);
    fill(big.addr() + 4 * MIB as u64, 4 * MIB, 0x6d);
    a.free_raw(big).unwrap();
    // The gaps, handed out again, hold what was written through the stitched block.
    let in_a = a.allocate_raw(4 * MIB, S0).unwrap();
    let in_c = a.allocate_raw(4 * MIB, S0).unwrap();
    assert_eq!([in_a.addr(), in_c.addr()], gaps);
    assert!(holds(in_a.addr(), 4 * MIB, 0x5c));
    assert!(holds(in_c.addr(), 4 * MIB, 0x6d));
    for (i, r) in kept.iter().enumerate() {
        assert!(holds(r.addr(), r.block_size(), 0xa0 + i as u8));
    }
    a.check_invariants().unwrap();
    for r in kept.into_iter().chain([in_a, in_c]) {
        a.free_raw(r).unwrap();
    }
    assert_eq!(a.empty_cache().unwrap(), 16 * MIB);
    assert_eq!(a.backend().free_bytes(), 64 * MIB);
}

/// Without aliases (a backend without multi-mapping) the gaps' pages move instead, and only for a
/// request at a new peak of allocated bytes: 8 MiB (16 MiB allocated, the old peak) maps new
/// pages, 12 MiB (20 MiB) gets the gaps' 4 pages moved and 2 new ones.
#[test]
fn without_aliases_the_gaps_pages_move_at_a_new_peak() {
    for (request, moves, maps, reserved) in [(8 * MIB, 0, 1, 24 * MIB), (12 * MIB, 2, 1, 20 * MIB)]
    {
        let sim = Arc::new(
            SimBackend::new(1 << 30)
                .with_page_granularity(PAGE)
                .without_aliases(),
        );
        let a = CachingAllocator::new(Arc::clone(&sim), stitching()).unwrap();
        let (_, kept) = two_gaps(&a);
        let before = sim.calls();
        let big = a.allocate_raw(request, S0).unwrap();
        let calls = sim.calls();
        assert_eq!(
            (calls.map_alias, calls.remap, calls.map - before.map),
            (0, moves, maps),
            "{request}"
        );
        assert_eq!(a.memory_stats().reserved_bytes.all.current, reserved as i64);
        a.check_invariants().unwrap();
        for x in kept.into_iter().chain([big]) {
            a.free_raw(x).unwrap();
        }
    }
}
