//! The spare bin of planned steps: the blocks of a loop's first step that no free block has
//! room for share one new segment, reserved when the step first asks for one of them.

use kiln_alloc_cache::*;
use std::sync::Arc;

mod planned_common;

use planned_common::{sim_alloc, MIB, S0};

/// Step 1 of a loop: two 12 MiB activations live together, then the optimizer's 12 MiB state
/// (kept). Each activation has a segment of its own and the state takes the first one's, so
/// at the next marker the one free block (12 MiB) holds one activation: the plan puts the
/// other in a spare bin. Returns the allocator, the backend, the state and the addresses of
/// the two segments (the state's, the free one).
fn first_step_with_state() -> (Arc<SimBackend>, CachingAllocator, RawAllocation, [u64; 2]) {
    let (sim, a) = sim_alloc(AllocatorConfig::default());
    a.mark_step().unwrap();
    let x = a.allocate_raw(12 * MIB, S0).unwrap();
    let y = a.allocate_raw(12 * MIB, S0).unwrap();
    let addrs = [x.addr(), y.addr()];
    a.free_raw(x).unwrap();
    a.free_raw(y).unwrap();
    let state = a.allocate_raw(12 * MIB, S0).unwrap();
    assert_eq!(state.addr(), addrs[0]);
    a.mark_step().unwrap();
    a.check_invariants().unwrap();
    (sim, a, state, addrs)
}

/// The spare bin is one segment, reserved when the step first asks for a block in it, not at
/// the marker; the step's blocks are placed without search, and the plan's peak is its peak
/// of live bytes.
#[test]
fn blocks_without_room_share_one_spare_segment_reserved_when_first_asked() {
    let (sim, a, state, [_, free]) = first_step_with_state();
    let calls = sim.calls().memory_calls();
    assert_eq!(calls, 2, "two 12 MiB segments");
    assert_eq!(
        a.plan_counts().1,
        12 * MIB,
        "the free segment is the plan's bin"
    );
    let x = a.allocate_raw(12 * MIB, S0).unwrap();
    assert_eq!(
        x.addr(),
        free,
        "the largest block first, in the smallest bin with room"
    );
    assert_eq!(
        sim.calls().memory_calls(),
        calls,
        "the spare is not reserved yet"
    );
    let y = a.allocate_raw(12 * MIB, S0).unwrap();
    assert_eq!(
        sim.calls().memory_calls(),
        calls + 1,
        "one segment for the spare bin"
    );
    assert_eq!(a.plan_counts().0.arena_allocs, 2, "both placed by the plan");
    let spare = a
        .snapshot()
        .segments
        .iter()
        .map(|s| (s.address, s.total_size))
        .max()
        .unwrap();
    assert_eq!((y.addr(), spare.1), (spare.0, 12 * MIB));
    let s = a.memory_stats();
    assert_eq!(
        s.reserved_bytes.all.peak,
        36 * MIB as i64,
        "peak live: 36 MiB"
    );
    assert_eq!(s.allocated_bytes.all.current, 36 * MIB as i64);
    a.check_invariants().unwrap();
    a.free_raw(x).unwrap();
    a.free_raw(y).unwrap();
    // Step 2 made no state: the state's request, the last of step 1, is one the cache served,
    // so step 2 used the whole plan, which serves the next steps at the same places.
    a.mark_step().unwrap();
    for _ in 0..3 {
        let x = a.allocate_raw(12 * MIB, S0).unwrap();
        let y = a.allocate_raw(12 * MIB, S0).unwrap();
        assert_eq!([x.addr(), y.addr()], [free, spare.0]);
        a.free_raw(x).unwrap();
        a.free_raw(y).unwrap();
        a.mark_step().unwrap();
    }
    let (counts, bytes) = a.plan_counts();
    assert_eq!(
        (
            counts.planned_steps,
            counts.fallback_steps,
            counts.arena_allocs
        ),
        (4, 0, 8)
    );
    assert_eq!(bytes, 24 * MIB, "the free segment and the spare");
    assert_eq!(sim.calls().memory_calls(), calls + 1);
    a.free_raw(state).unwrap();
    a.check_invariants().unwrap();
}

/// A step that leaves the plan before asking for a block of its spare bin reserves nothing for
/// it: the cache serves the rest of the step as it would without a plan.
#[test]
fn a_step_leaving_the_plan_before_its_spare_blocks_reserves_no_spare() {
    let (sim, a, state, [_, free]) = first_step_with_state();
    let calls = sim.calls().memory_calls();
    let x = a.allocate_raw(12 * MIB, S0).unwrap();
    assert_eq!(x.addr(), free);
    // 20 MiB is not the plan's second request: the cache gets a segment for it (the idle
    // bins went back first), and nothing else is reserved.
    let y = a.allocate_raw(20 * MIB, S0).unwrap();
    assert_eq!(sim.calls().memory_calls(), calls + 1);
    assert_eq!(
        a.memory_stats().reserved_bytes.all.current,
        (24 + 20) * MIB as i64
    );
    a.check_invariants().unwrap();
    for r in [x, y, state] {
        a.free_raw(r).unwrap();
    }
    a.mark_step().unwrap();
    let (counts, bytes) = a.plan_counts();
    assert_eq!(
        (counts.fallback_steps, counts.arena_allocs, bytes),
        (1, 1, 0)
    );
    a.check_invariants().unwrap();
}
