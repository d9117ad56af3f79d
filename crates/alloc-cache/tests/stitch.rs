//! Page stitching (expandable segments with `page_stitching`) on backends without alias
//! mappings: the pages of free gaps move to a request that fits no free block, on the
//! simulated backend (which numbers physical pages); and what every backend must keep, with or
//! without aliases (random sequences, host memory). Stitched blocks kept through aliases are
//! tested in `stitched.rs`.

use kiln_alloc_cache::synth::SplitMix64;
use kiln_alloc_cache::*;
use std::collections::HashMap;
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

/// An allocator on a simulated device without alias mappings (pages are moved).
fn sim_alloc(capacity: usize, config: AllocatorConfig) -> (Arc<SimBackend>, CachingAllocator) {
    sim_alloc_with(capacity, config, false)
}

fn sim_alloc_with(
    capacity: usize,
    config: AllocatorConfig,
    aliases: bool,
) -> (Arc<SimBackend>, CachingAllocator) {
    let sim = SimBackend::new(capacity).with_page_granularity(PAGE);
    let sim = Arc::new(if aliases { sim } else { sim.without_aliases() });
    let a = CachingAllocator::new(Arc::clone(&sim), config).unwrap();
    (sim, a)
}

/// Four 4 MiB blocks, the first and third to be freed: a 12 MiB request fits neither gap and
/// takes allocated bytes to a new peak.
fn two_gaps(a: &CachingAllocator) -> (Vec<RawAllocation>, Vec<RawAllocation>) {
    let mut blocks: Vec<_> = (0..4)
        .map(|_| a.allocate_raw(4 * MIB, S0).unwrap())
        .collect();
    let kept = vec![blocks.remove(3), blocks.remove(1)];
    (blocks, kept)
}

#[test]
fn a_request_fitting_no_gap_gets_the_gaps_pages() {
    let (sim, a) = sim_alloc(1 << 30, stitching());
    let (gaps, kept) = two_gaps(&a);
    let mut gap_pages: Vec<u64> = gaps
        .iter()
        .flat_map(|g| sim.physical_pages(g.addr(), 4 * MIB).unwrap())
        .collect();
    for g in gaps {
        a.free_raw(g).unwrap();
    }
    let before = (sim.calls(), a.memory_stats());
    let big = a.allocate_raw(12 * MIB, S0).unwrap();
    let (calls, stats) = (sim.calls(), a.memory_stats());
    // One move per gap, one map for the 4 MiB the gaps lack, nothing given back.
    assert_eq!(
        (
            calls.map - before.0.map,
            calls.remap - before.0.remap,
            calls.unmap - before.0.unmap
        ),
        (1, 2, 0)
    );
    assert_eq!(stats.reserved_bytes.all.current, 20 * MIB as i64);
    assert_eq!(sim.used_bytes(), 20 * MIB);
    assert_eq!(stats.num_device_alloc - before.1.num_device_alloc, 3);
    assert_eq!(stats.num_device_free - before.1.num_device_free, 2);
    // Fresh physical pages are numbered above every earlier one.
    let mut got = sim.physical_pages(big.addr(), 12 * MIB).unwrap();
    got.sort_unstable();
    gap_pages.sort_unstable();
    assert_eq!(got[..4], gap_pages, "the request got the gaps' memory");
    a.check_invariants().unwrap();
    // The gaps are holes now: a 4 MiB request is served by mapping pages into one of them.
    let small = a.allocate_raw(4 * MIB, S0).unwrap();
    assert_eq!(small.addr(), gaps_addr(&kept[1], 4 * MIB));
    assert_eq!(sim.calls().map - calls.map, 1);
    a.check_invariants().unwrap();
    for r in kept.into_iter().chain([big, small]) {
        a.free_raw(r).unwrap();
    }
    assert_eq!(a.empty_cache().unwrap(), 24 * MIB);
    assert_eq!(sim.live_ranges(), (0, 0, 0));
}

/// The address of the block `bytes` below `r` (the first gap of [`two_gaps`] sits below the
/// first kept block).
fn gaps_addr(r: &RawAllocation, bytes: usize) -> u64 {
    r.addr() - bytes as u64
}

#[test]
fn without_page_stitching_the_same_request_maps_new_pages() {
    let (sim, a) = sim_alloc(1 << 30, AllocatorConfig::expandable());
    let (gaps, kept) = two_gaps(&a);
    for g in gaps {
        a.free_raw(g).unwrap();
    }
    let maps = sim.calls().map;
    let big = a.allocate_raw(12 * MIB, S0).unwrap();
    assert_eq!((sim.calls().map - maps, sim.calls().remap), (1, 0));
    assert_eq!(a.memory_stats().reserved_bytes.all.current, 28 * MIB as i64);
    // Out of memory, the gaps' pages move even so: a device of 16 MiB still fits it.
    let (sim, a) = sim_alloc(16 * MIB, AllocatorConfig::expandable());
    let (gaps, kept_too) = two_gaps(&a);
    for g in gaps {
        a.free_raw(g).unwrap();
    }
    let tight = a.allocate_raw(8 * MIB, S0).unwrap();
    let s = a.memory_stats();
    assert_eq!((s.num_ooms, s.num_alloc_retries), (0, 0));
    assert_eq!((sim.calls().remap, sim.used_bytes()), (2, 16 * MIB));
    a.check_invariants().unwrap();
    for r in kept_too.into_iter().chain([tight]) {
        a.free_raw(r).unwrap();
    }
    drop((kept, big));
}

/// Whole pages inside free blocks (snapshot view).
fn free_whole_pages(a: &CachingAllocator) -> usize {
    let page = PAGE as u64;
    a.snapshot()
        .segments
        .iter()
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state == BlockSnapshotState::Inactive && b.fully_mapped)
        .map(|b| {
            let first = b.address.div_ceil(page);
            let end = (b.address + b.size as u64) / page;
            end.saturating_sub(first) as usize
        })
        .sum()
}

/// Every physical page behind a live block is reachable at one address only.
fn disjoint_memory(sim: &SimBackend, live: &[RawAllocation], ctx: &str) {
    let page = PAGE as u64;
    let mut owner: HashMap<u64, u64> = HashMap::new();
    for r in live {
        let first = r.addr() / page * page;
        let end = (r.addr() + r.block_size() as u64).div_ceil(page) * page;
        let phys = sim
            .physical_pages(first, (end - first) as usize)
            .unwrap_or_else(|e| panic!("{ctx}: live block {:#x} not backed: {e}", r.addr()));
        for (i, p) in phys.into_iter().enumerate() {
            let va = first + i as u64 * page;
            let seen = *owner.entry(p).or_insert(va);
            assert_eq!(
                seen, va,
                "{ctx}: physical page {p} at {seen:#x} and {va:#x}"
            );
        }
    }
}

fn run(seed: u64, config: AllocatorConfig, capacity: usize, steps: usize, aliases: bool) -> usize {
    let (sim, a) = sim_alloc_with(capacity, config, aliases);
    let mut rng = SplitMix64(seed);
    let mut live: Vec<RawAllocation> = Vec::new();
    let mut ooms = 0;
    for step in 0..steps {
        let ctx = format!("seed {seed}, step {step}");
        if rng.range(0, 99) < 55 || live.is_empty() {
            let size = match rng.range(0, 9) {
                0..=4 => rng.range(1, MIB as u64) as usize,
                5..=8 => rng.range(MIB as u64, 8 * MIB as u64) as usize,
                _ => rng.range(8 * MIB as u64, 24 * MIB as u64) as usize,
            };
            let pages = round_size(size).div_ceil(PAGE);
            let room = free_whole_pages(&a) + sim.free_bytes() / PAGE;
            match a.allocate_raw(size, S0) {
                Ok(r) => live.push(r),
                Err(Error::OutOfMemory(report)) => {
                    ooms += 1;
                    assert!(
                        room < pages,
                        "{ctx}: out of memory for {pages} pages with {room} free:\n{report}"
                    );
                }
                Err(e) => panic!("{ctx}: {e}"),
            }
        } else {
            let r = live.swap_remove(rng.range(0, live.len() as u64 - 1) as usize);
            a.free_raw(r).unwrap();
        }
        if rng.range(0, 99) == 0 {
            a.empty_cache().unwrap();
        }
        if let Err(e) = a.check_invariants() {
            panic!("{ctx}: {e}");
        }
        let s = a.memory_stats();
        assert_eq!(
            s.reserved_bytes.all.current as usize,
            sim.used_bytes(),
            "{ctx}"
        );
        assert_eq!(s.allocation.all.current as usize, live.len(), "{ctx}");
        disjoint_memory(&sim, &live, &ctx);
    }
    for r in live.drain(..) {
        a.free_raw(r).unwrap();
    }
    a.empty_cache().unwrap();
    assert_eq!(sim.live_ranges(), (0, 0, 0), "seed {seed}");
    let calls = sim.calls();
    let stitched = if aliases {
        calls.map_alias
    } else {
        calls.remap
    };
    assert!(stitched > 0, "seed {seed}: nothing was stitched");
    ooms
}

/// Seeded random sequences on a 96 MiB device, with stitched blocks (aliases), with moved
/// pages and without stitching: after every event the statistics equal a recomputation (and
/// reserved bytes the device's), no physical page backs two live addresses, and no request
/// fails while free whole pages and the device's free memory could hold it.
#[test]
fn random_sequences_keep_memory_disjoint_and_use_every_free_page() {
    let mut ooms = 0;
    for seed in 0..6 {
        ooms += run(seed, stitching(), 96 * MIB, 1500, true);
        ooms += run(seed + 20, stitching(), 96 * MIB, 1500, false);
        ooms += run(
            seed + 50,
            AllocatorConfig::expandable(),
            96 * MIB,
            1500,
            false,
        );
    }
    assert!(ooms > 0, "the capacity was never reached");
}

/// Stitching moves pages only when allocated bytes reach a new peak, so a repeating step
/// settles at once: from the third replay on no backend call is made. The first replay holds
/// at most 3% more than its live peak (without stitching the MLP step holds 4.7% more).
#[test]
fn stitching_settles_on_the_shipped_fixed_shape_steps() {
    for (name, text, first_bound) in [
        ("mlp", include_str!("../traces/mlp_step_b1024.trace"), 1.002),
        (
            "resnet18",
            include_str!("../traces/resnet18_step_b32.trace"),
            1.03,
        ),
        (
            "transformer",
            include_str!("../traces/transformer_fixed_b8_t512.trace"),
            1.002,
        ),
    ] {
        let trace = Trace::parse(text).unwrap();
        let mut r = Replayer::with_config(stitching(), replay::DEFAULT_REPLAY_CAPACITY).unwrap();
        r.run(&trace).unwrap();
        let first = r.report();
        assert!(first.reserved_over_live <= first_bound, "{name}: {first:?}");
        let plain = replay(
            &trace,
            ReplayMode::Expandable,
            replay::DEFAULT_REPLAY_CAPACITY,
        )
        .unwrap();
        assert!(
            first.reserved_over_live <= plain.reserved_over_live,
            "{name}"
        );
        r.run(&trace).unwrap();
        let settled = r.sim().calls();
        for _ in 0..8 {
            r.run(&trace).unwrap();
        }
        assert_eq!(
            r.sim().calls(),
            settled,
            "{name}: calls after the second replay"
        );
        let report = r.report();
        assert!(report.reserved_over_live <= 1.03, "{name}: {report:?}");
        assert_eq!(report.ooms, 0);
    }
}

/// Host memory (Linux), at the default page and at 2 MiB: what a live block holds survives the stitching of the gaps around it,
/// and the stitched block is ordinary writable memory.
#[cfg(target_os = "linux")]
#[test]
fn host_pages_keep_live_data_through_stitching() {
    for page in [DEFAULT_HOST_PAGE, 2 * MIB] {
        host_pages_keep_live_data_through_stitching_at(page);
    }
}

#[cfg(target_os = "linux")]
fn host_pages_keep_live_data_through_stitching_at(page: usize) {
    let host = HostBackend::with_capacity(64 * MIB)
        .with_page_mapping_of(page)
        .unwrap();
    let a = CachingAllocator::new(host, stitching()).unwrap();
    let (gaps, kept) = two_gaps(&a);
    let fill = |r: &RawAllocation, byte: u8| {
        // SAFETY: `r` is a live block of `r.block_size()` bytes of host memory.
        unsafe { std::ptr::write_bytes(r.addr() as usize as *mut u8, byte, r.block_size()) }
    };
    let holds = |r: &RawAllocation, byte: u8| {
        // SAFETY: as above.
        let s = unsafe { std::slice::from_raw_parts(r.addr() as usize as *const u8, r.size()) };
        s.iter().all(|&b| b == byte)
    };
    for (i, r) in kept.iter().enumerate() {
        fill(r, 0xa0 + i as u8);
    }
    for g in &gaps {
        fill(g, 0x11);
    }
    for g in gaps {
        a.free_raw(g).unwrap();
    }
    let big = a.allocate_raw(12 * MIB, S0).unwrap();
    assert_eq!(a.memory_stats().reserved_bytes.all.current, 20 * MIB as i64);
    assert_eq!(a.backend().free_bytes(), 44 * MIB);
    fill(&big, 0x5c);
    assert!(holds(&big, 0x5c));
    for (i, r) in kept.iter().enumerate() {
        assert!(holds(r, 0xa0 + i as u8), "kept block {i} changed");
    }
    a.check_invariants().unwrap();
    for r in kept.into_iter().chain([big]) {
        a.free_raw(r).unwrap();
    }
    assert_eq!(a.empty_cache().unwrap(), 20 * MIB);
    assert_eq!(a.backend().free_bytes(), 64 * MIB);
}

#[test]
fn page_stitching_is_a_setting_of_expandable_segments() {
    let c = AllocatorConfig::parse("expandable_segments:True,page_stitching:True").unwrap();
    assert_eq!(c, stitching());
    let e = AllocatorConfig::parse("page_stitching:True").unwrap_err();
    assert!(e.to_string().contains("turn expandable_segments on"), "{e}");
    let e = AllocatorConfig::parse("page_stitching:maybe").unwrap_err();
    assert!(e.to_string().contains("expected True or False"), "{e}");
}

#[test]
fn replay_stitched_reuses_the_gaps_memory_where_plain_expandable_maps_new_ones() {
    // Four 4 MiB blocks, the first and third freed (two 4 MiB gaps between live blocks, none at
    // the segment's growable end), then a 12 MiB request that fits neither gap and sets a new
    // peak of live bytes (20 MiB).
    let text = "a 1 4194304\na 2 4194304\na 3 4194304\na 4 4194304\nf 1\nf 3\na 5 12582912\n\
                f 2\nf 4\nf 5\n";
    let trace = Trace::parse(text).unwrap();
    let capacity = 1 << 30;
    let plain = replay(&trace, ReplayMode::Expandable, capacity).unwrap();
    let stitched = replay_stitched(&trace, capacity).unwrap();
    assert_eq!(plain.peak_live_bytes, 20 << 20);
    assert_eq!(stitched.peak_live_bytes, 20 << 20);
    // Plain: the gaps stay mapped and 12 MiB more are mapped past the last block.
    assert_eq!(plain.peak_reserved_bytes, 28 << 20);
    // Stitched: the request reaches the gaps' 8 MiB through aliases, only 4 MiB are new.
    assert_eq!(stitched.peak_reserved_bytes, 20 << 20);
    assert_eq!(stitched.reserved_over_live, 1.0);
    assert_eq!(stitched.ooms, 0);
}

#[test]
fn moved_pages_come_from_the_largest_gap_first_and_from_its_end() {
    // A full 20 MiB device: gaps of 4 MiB (A) and 8 MiB (C) between kept blocks. A 10 MiB
    // request (5 pages) is no new peak, so it first asks for new pages, gets out-of-memory and
    // takes five of the gaps' six pages instead: C's four (the largest gap: fewest moves) and
    // the last of A's two, so A's start is still a free 2 MiB block where it was.
    let (sim, a) = sim_alloc(20 * MIB, stitching());
    let gap_a = a.allocate_raw(4 * MIB, S0).unwrap();
    let b = a.allocate_raw(4 * MIB, S0).unwrap();
    let gap_c = a.allocate_raw(8 * MIB, S0).unwrap();
    let d = a.allocate_raw(4 * MIB, S0).unwrap();
    let (a_addr, c_addr) = (gap_a.addr(), gap_c.addr());
    a.free_raw(gap_a).unwrap();
    a.free_raw(gap_c).unwrap();
    let remaps = sim.calls().remap;
    let big = a.allocate_raw(10 * MIB, S0).unwrap();
    assert_eq!(sim.calls().remap - remaps, 2, "one move per gap");
    assert_eq!(sim.used_bytes(), 20 * MIB);
    a.check_invariants().unwrap();
    let small = a.allocate_raw(2 * MIB, S0).unwrap();
    assert_eq!(
        small.addr(),
        a_addr,
        "A's first page stayed (C at {c_addr:#x} gave all of its pages)"
    );
    a.check_invariants().unwrap();
    for r in [b, d, big, small] {
        a.free_raw(r).unwrap();
    }
}

#[test]
fn a_request_filling_a_hole_and_the_free_block_after_it_exactly_maps_only_the_hole() {
    // x, a 4 MiB hole (y's pages given back), w (2 MiB, free and mapped), z: a 6 MiB request
    // is exactly the hole plus w, so it maps the hole's two pages and takes w, not six new
    // pages past z.
    let (sim, a) = sim_alloc(1 << 30, AllocatorConfig::expandable());
    let x = a.allocate_raw(4 * MIB, S0).unwrap();
    let y = a.allocate_raw(4 * MIB, S0).unwrap();
    let w = a.allocate_raw(2 * MIB, S0).unwrap();
    let z = a.allocate_raw(4 * MIB, S0).unwrap();
    let y_addr = y.addr();
    a.free_raw(y).unwrap();
    assert_eq!(a.empty_cache().unwrap(), 4 * MIB);
    a.free_raw(w).unwrap();
    let maps = sim.calls().map;
    let r = a.allocate_raw(6 * MIB, S0).unwrap();
    assert_eq!(r.addr(), y_addr);
    assert_eq!(sim.calls().map - maps, 1);
    assert_eq!(a.memory_stats().reserved_bytes.all.current, 14 * MIB as i64);
    a.check_invariants().unwrap();
    for b in [x, z, r] {
        a.free_raw(b).unwrap();
    }
}
