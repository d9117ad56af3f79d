//! Fixed segments for large-pool requests under 10 MiB: whole copies of the request, or the
//! request alone when the large pool already caches fragmented free memory.

use kiln_alloc_cache::*;
use std::sync::Arc;

const MIB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

fn fresh() -> (Arc<SimBackend>, CachingAllocator) {
    let sim = Arc::new(SimBackend::new(1 << 30).with_page_granularity(2 * MIB));
    let a = CachingAllocator::new(Arc::clone(&sim), AllocatorConfig::default()).unwrap();
    (sim, a)
}

#[test]
fn a_first_miss_reserves_the_whole_copies_that_waste_least() {
    // (request, segment): 9 MiB -> two copies in 18 MiB; 4 MiB -> five in 20 MiB; 4.5 MiB ->
    // four in 18 MiB; 7 MiB -> two in 14 MiB; 3 MiB -> six in 18 MiB (20 MiB would hold six
    // with a 2 MiB tail); 0.75 MiB -> 24 in 18 MiB (8 in 6 MiB waste nothing either; ties go
    // to the most copies).
    for (request, segment) in [
        (9 * MIB, 18 * MIB),
        (4 * MIB, 20 * MIB),
        (9 * MIB / 2, 18 * MIB),
        (7 * MIB, 14 * MIB),
        (3 * MIB, 18 * MIB),
        (3 * MIB / 4, 18 * MIB),
    ] {
        let (sim, a) = fresh();
        let r = a.allocate_raw(request, S0).unwrap();
        assert_eq!(
            a.memory_stats().reserved_bytes.large_pool.current,
            segment as i64,
            "request {request}"
        );
        assert_eq!(sim.calls().reserve, 1);
        a.free_raw(r).unwrap();
        a.check_invariants().unwrap();
    }
}

#[test]
fn a_fragmentation_miss_reserves_only_the_request() {
    let (sim, a) = fresh();
    // Five 4 MiB blocks fill one 20 MiB segment; freeing the 1st, 3rd and 5th leaves 12 MiB
    // cached in three 4 MiB holes.
    let mut blocks: Vec<_> = (0..5)
        .map(|_| Some(a.allocate_raw(4 * MIB, S0).unwrap()))
        .collect();
    for i in [0, 2, 4] {
        a.free_raw(blocks[i].take().unwrap()).unwrap();
    }
    // 6 MiB fits no hole: with 12 MiB (over half a 20 MiB segment) cached, the new segment is
    // 6 MiB, not the 18 MiB of three copies.
    let six = a.allocate_raw(6 * MIB, S0).unwrap();
    let s = a.memory_stats();
    assert_eq!(s.reserved_bytes.large_pool.current, 26 * MIB as i64);
    assert_eq!(sim.calls().reserve, 2);
    assert_eq!(six.block_size(), 6 * MIB);
    a.free_raw(six).unwrap();
    for b in blocks.into_iter().flatten() {
        a.free_raw(b).unwrap();
    }
    a.check_invariants().unwrap();
}
