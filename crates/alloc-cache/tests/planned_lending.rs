//! A planned step lends the idle space of its bins to kernel scratch taken under
//! [`StepThread::OUTSIDE`] when the cache has no free block for it, instead of mapping new
//! memory beside bins that sit idle; a planned allocation whose place a lent block still holds
//! is served by the cache without leaving the plan. Once a step has been served past its last
//! planned block, work the recorded step did not make (an evaluation after the loop's steps)
//! that finds no free block, but would fit an idle bin, gets the idle bins back instead of new
//! memory.

use kiln_alloc_cache::planned::PlannedCounts;
use kiln_alloc_cache::*;

mod planned_common;

use planned_common::{sim_alloc, MIB, S0};

/// Scratch of `bytes` taken as a kernel's parallel task takes it.
fn scratch(a: &CachingAllocator, bytes: usize) -> RawAllocation {
    let _outside = StepThread::OUTSIDE.enter();
    a.allocate_raw(bytes, S0).unwrap()
}

/// An allocator whose plan serves the step `x` (12 MiB), `y` (12 MiB), free `x`, `z` (12
/// MiB), free `y`, free `z`, recorded from one step: two 12 MiB segments, both bins, and no
/// free block left in the cache.
fn planned_two_bins() -> (std::sync::Arc<SimBackend>, CachingAllocator) {
    let (sim, a) = sim_alloc(AllocatorConfig::default());
    a.mark_step().unwrap();
    let x = a.allocate_raw(12 * MIB, S0).unwrap();
    finish_step(&a, x);
    a.mark_step().unwrap();
    assert_eq!(
        a.plan_counts().1,
        24 * MIB,
        "both segments are the plan's bins"
    );
    assert_eq!(sim.calls().memory_calls(), 2);
    (sim, a)
}

/// The rest of the step of [`planned_two_bins`] after its first block `x`.
fn finish_step(a: &CachingAllocator, x: RawAllocation) {
    let y = a.allocate_raw(12 * MIB, S0).unwrap();
    a.free_raw(x).unwrap();
    let z = a.allocate_raw(12 * MIB, S0).unwrap();
    a.free_raw(y).unwrap();
    a.free_raw(z).unwrap();
}

fn counts(a: &CachingAllocator) -> PlannedCounts {
    a.plan_counts().0
}

#[test]
fn scratch_borrows_a_bin_that_no_planned_block_holds_and_maps_nothing() {
    let (sim, a) = planned_two_bins();
    for _ in 0..3 {
        let x = a.allocate_raw(12 * MIB, S0).unwrap();
        // x holds one bin; the other is idle until y: the scratch goes there.
        let s = scratch(&a, 10 * MIB);
        a.check_invariants().unwrap();
        let stats = a.memory_stats();
        assert_eq!(stats.allocated_bytes.all.current, 22 * MIB as i64);
        assert_eq!(stats.active_bytes.all.current, 22 * MIB as i64);
        a.free_raw(s).unwrap();
        finish_step(&a, x);
        a.check_invariants().unwrap();
        a.mark_step().unwrap();
    }
    let c = counts(&a);
    assert_eq!(
        (c.planned_steps, c.fallback_steps, c.arena_allocs),
        (3, 0, 9)
    );
    assert_eq!((c.lent_allocs, c.displaced_allocs), (3, 0));
    assert_eq!(
        sim.calls().memory_calls(),
        2,
        "no new memory for the scratch"
    );
    let stats = a.memory_stats();
    assert_eq!(stats.reserved_bytes.all.peak, 24 * MIB as i64);
    assert_eq!(stats.allocated_bytes.all.current, 0);
}

#[test]
fn a_planned_block_whose_place_a_lent_block_holds_goes_to_the_cache_and_the_plan_goes_on() {
    let (sim, a) = planned_two_bins();
    let x = a.allocate_raw(12 * MIB, S0).unwrap();
    let s = scratch(&a, 10 * MIB);
    // y's place is the scratch's until it is freed: the cache maps a segment for y.
    let y = a.allocate_raw(12 * MIB, S0).unwrap();
    assert!(y.addr() + 12 * MIB as u64 <= s.addr() || s.addr() + 10 * MIB as u64 <= y.addr());
    assert_eq!(sim.calls().memory_calls(), 3);
    a.free_raw(s).unwrap();
    a.free_raw(x).unwrap();
    let z = a.allocate_raw(12 * MIB, S0).unwrap();
    a.free_raw(y).unwrap();
    a.free_raw(z).unwrap();
    a.check_invariants().unwrap();
    a.mark_step().unwrap();
    let c = counts(&a);
    assert_eq!((c.planned_steps, c.fallback_steps), (1, 0));
    assert_eq!(
        (c.arena_allocs, c.lent_allocs, c.displaced_allocs),
        (2, 1, 1)
    );
    // The next step is served whole from the plan again (y's segment is cache, not bin).
    let x = a.allocate_raw(12 * MIB, S0).unwrap();
    let y = a.allocate_raw(12 * MIB, S0).unwrap();
    a.free_raw(x).unwrap();
    a.free_raw(y).unwrap();
    let z = a.allocate_raw(12 * MIB, S0).unwrap();
    a.free_raw(z).unwrap();
    a.mark_step().unwrap();
    let c = counts(&a);
    assert_eq!(
        (c.planned_steps, c.fallback_steps, c.arena_allocs),
        (2, 0, 5)
    );
    assert_eq!(sim.calls().memory_calls(), 3);
}

#[test]
fn scratch_goes_where_the_next_planned_use_is_furthest_ahead() {
    let (_sim, a) = sim_alloc(AllocatorConfig::default());
    // Three 12 MiB blocks live together: three segments, three bins.
    let step = |a: &CachingAllocator| {
        let blocks: Vec<_> = (0..3)
            .map(|_| a.allocate_raw(12 * MIB, S0).unwrap())
            .collect();
        let addrs: Vec<u64> = blocks.iter().map(|b| b.addr()).collect();
        for b in blocks {
            a.free_raw(b).unwrap();
        }
        addrs
    };
    a.mark_step().unwrap();
    step(&a);
    a.mark_step().unwrap();
    // Before the step's first allocation every bin is idle: the one used last is lent.
    let s = scratch(&a, 4 * MIB);
    let lent = s.addr();
    a.free_raw(s).unwrap();
    let addrs = step(&a);
    a.mark_step().unwrap();
    assert!(
        (addrs[2]..addrs[2] + 12 * MIB as u64).contains(&lent),
        "scratch at {lent:#x}, planned blocks at {addrs:x?}"
    );
    let c = counts(&a);
    assert_eq!(
        (c.planned_steps, c.lent_allocs, c.displaced_allocs),
        (1, 1, 0)
    );
}

#[test]
fn another_thread_that_is_not_scratch_borrows_nothing() {
    let (sim, a) = planned_two_bins();
    let x = a.allocate_raw(12 * MIB, S0).unwrap();
    // A loader's thread: its batch may outlive the step, so the cache serves it.
    let batch =
        std::thread::scope(|t| t.spawn(|| a.allocate_raw(10 * MIB, S0).unwrap()).join()).unwrap();
    assert_eq!(sim.calls().memory_calls(), 3);
    a.free_raw(batch).unwrap();
    finish_step(&a, x);
    a.mark_step().unwrap();
    let c = counts(&a);
    assert_eq!(
        (c.planned_steps, c.lent_allocs, c.displaced_allocs),
        (1, 0, 0)
    );
}

#[test]
fn a_lent_block_outliving_a_dropped_plan_keeps_the_bins_until_it_is_freed() {
    let (sim, a) = planned_two_bins();
    let x = a.allocate_raw(12 * MIB, S0).unwrap();
    let s = scratch(&a, 10 * MIB);
    // Another shape: the step deviates (the cache maps a segment for it) and the plan is
    // dropped; its bins wait for their last block, the scratch.
    let other = a.allocate_raw(5 * MIB, S0).unwrap();
    assert_eq!(sim.calls().memory_calls(), 3);
    a.free_raw(x).unwrap();
    a.free_raw(other).unwrap();
    a.mark_step().unwrap();
    a.check_invariants().unwrap();
    assert_eq!(
        a.memory_stats().allocated_bytes.all.current,
        10 * MIB as i64
    );
    a.free_raw(s).unwrap();
    a.check_invariants().unwrap();
    let c = counts(&a);
    assert_eq!(
        (c.planned_steps, c.fallback_steps, c.lent_allocs),
        (0, 1, 1)
    );
    // Both bins are back in the pools: two 12 MiB blocks need no new memory.
    let p = a.allocate_raw(12 * MIB, S0).unwrap();
    let q = a.allocate_raw(12 * MIB, S0).unwrap();
    assert_eq!(sim.calls().memory_calls(), 3);
    a.free_raw(p).unwrap();
    a.free_raw(q).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn scratch_no_bin_can_hold_gets_a_segment_of_its_own_size_not_padded_copies() {
    let (_sim, a) = planned_two_bins();
    let x = a.allocate_raw(12 * MIB, S0).unwrap();
    let y = a.allocate_raw(12 * MIB, S0).unwrap();
    // Both bins are full: the scratch's 3 MiB, rounded to whole 2 MiB pages.
    let s = scratch(&a, 3 * MIB);
    let reserved = |a: &CachingAllocator| a.memory_stats().reserved_bytes.all.current;
    assert_eq!(reserved(&a), (24 + 4) * MIB as i64);
    // Not scratch: the cache's usual segment of six copies.
    let other =
        std::thread::scope(|t| t.spawn(|| a.allocate_raw(3 * MIB, S0).unwrap()).join()).unwrap();
    assert_eq!(reserved(&a), (24 + 4 + 18) * MIB as i64);
    for b in [s, other, x, y] {
        a.free_raw(b).unwrap();
    }
    a.check_invariants().unwrap();
}

#[test]
fn emptying_the_cache_while_only_scratch_is_lent_counts_no_step() {
    let (_sim, a) = planned_two_bins();
    // The step has asked for nothing yet; only scratch holds bin space.
    let s = scratch(&a, 10 * MIB);
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
    let c = counts(&a);
    assert_eq!(
        (c.planned_steps, c.fallback_steps, c.lent_allocs),
        (0, 0, 1)
    );
    // The lent block became an ordinary block of its segment and frees as one.
    a.free_raw(s).unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.memory_stats().allocated_bytes.all.current, 0);
}

#[test]
fn work_after_the_last_planned_block_gets_the_idle_bins_not_new_memory() {
    let (sim, a) = planned_two_bins();
    let x = a.allocate_raw(12 * MIB, S0).unwrap();
    finish_step(&a, x);
    // An evaluation before the next marker: nothing free in the cache, both bins idle.
    let eval: Vec<_> = (0..2)
        .map(|_| a.allocate_raw(10 * MIB, S0).unwrap())
        .collect();
    a.check_invariants().unwrap();
    assert_eq!(
        sim.calls().memory_calls(),
        2,
        "no new memory for the evaluation"
    );
    let c = counts(&a);
    assert_eq!(
        (c.planned_steps, c.fallback_steps),
        (1, 0),
        "the step was served whole"
    );
    for b in eval {
        a.free_raw(b).unwrap();
    }
    a.mark_step().unwrap();
    // Recording starts again: two steps alike are planned, and the plan serves the next.
    for _ in 0..4 {
        let x = a.allocate_raw(12 * MIB, S0).unwrap();
        finish_step(&a, x);
        a.mark_step().unwrap();
    }
    a.check_invariants().unwrap();
    let c = counts(&a);
    assert_eq!(
        (c.planned_steps, c.fallback_steps, c.arena_allocs),
        (3, 0, 9)
    );
    assert_eq!(sim.calls().memory_calls(), 2);
    assert_eq!(a.memory_stats().reserved_bytes.all.peak, 24 * MIB as i64);
}

#[test]
fn work_after_the_step_waits_for_a_bin_that_a_planned_block_still_holds() {
    let (sim, a) = planned_two_bins();
    let x = a.allocate_raw(12 * MIB, S0).unwrap();
    let y = a.allocate_raw(12 * MIB, S0).unwrap();
    a.free_raw(x).unwrap();
    let z = a.allocate_raw(12 * MIB, S0).unwrap();
    a.free_raw(y).unwrap();
    // z, the plan's last block, is still live in one bin: only the other goes back.
    let eval = a.allocate_raw(10 * MIB, S0).unwrap();
    assert_eq!(sim.calls().memory_calls(), 2);
    let other = a.allocate_raw(10 * MIB, S0).unwrap();
    assert_eq!(
        sim.calls().memory_calls(),
        3,
        "z's bin is not the cache's yet"
    );
    a.check_invariants().unwrap();
    let c = counts(&a);
    assert_eq!((c.planned_steps, c.fallback_steps), (0, 1));
    // Freeing z gives its bin back whole.
    a.free_raw(z).unwrap();
    a.check_invariants().unwrap();
    let again = a.allocate_raw(12 * MIB, S0).unwrap();
    assert_eq!(sim.calls().memory_calls(), 3);
    for b in [eval, other, again] {
        a.free_raw(b).unwrap();
    }
    a.check_invariants().unwrap();
}

#[test]
fn another_thread_missing_after_the_step_leaves_the_plan_alone() {
    let (sim, a) = planned_two_bins();
    let x = a.allocate_raw(12 * MIB, S0).unwrap();
    finish_step(&a, x);
    // The marking thread logs a value past the plan (the small pool, where the plan has no
    // bin: the cache maps it a segment)...
    let logged = a.allocate_raw(4 << 10, S0).unwrap();
    assert_eq!(sim.calls().memory_calls(), 3);
    // ...then a loader's thread prefetches the next batch: the cache maps memory, the plan
    // stays.
    let batch =
        std::thread::scope(|t| t.spawn(|| a.allocate_raw(10 * MIB, S0).unwrap()).join()).unwrap();
    assert_eq!(sim.calls().memory_calls(), 4);
    a.mark_step().unwrap();
    let x = a.allocate_raw(12 * MIB, S0).unwrap();
    finish_step(&a, x);
    a.mark_step().unwrap();
    a.free_raw(batch).unwrap();
    a.free_raw(logged).unwrap();
    let c = counts(&a);
    assert_eq!(
        (c.planned_steps, c.fallback_steps, c.arena_allocs),
        (2, 0, 6)
    );
}

#[test]
fn work_after_the_step_that_no_idle_bin_could_hold_leaves_the_plan_alone() {
    let (sim, a) = planned_two_bins();
    let x = a.allocate_raw(12 * MIB, S0).unwrap();
    finish_step(&a, x);
    // A logged value: the small pool, where the plan has no bin. The cache maps it a segment.
    let logged = a.allocate_raw(4 << 10, S0).unwrap();
    assert_eq!(sim.calls().memory_calls(), 3);
    // Larger than either bin: they could not hold it either.
    let big = a.allocate_raw(14 * MIB, S0).unwrap();
    assert_eq!(sim.calls().memory_calls(), 4);
    a.free_raw(big).unwrap();
    a.mark_step().unwrap();
    let x = a.allocate_raw(12 * MIB, S0).unwrap();
    finish_step(&a, x);
    a.mark_step().unwrap();
    a.free_raw(logged).unwrap();
    a.check_invariants().unwrap();
    let c = counts(&a);
    assert_eq!(
        (c.planned_steps, c.fallback_steps, c.arena_allocs),
        (2, 0, 6)
    );
}
