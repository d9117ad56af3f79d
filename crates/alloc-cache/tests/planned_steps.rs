//! Planned steps inside the allocator (`planned_steps:True` and `mark_step`): a steady loop is
//! packed into the cache's own free memory and served from it without search or backend call;
//! deviations fall back to the cache without failing; statistics stay true throughout.

use kiln_alloc_cache::planned::BinPlan;
use kiln_alloc_cache::synth::SplitMix64;
use kiln_alloc_cache::*;
use std::sync::Arc;

mod planned_common;

use planned_common::{sim_alloc, MIB, S0};

/// One step: 100 B, 1000 B, free the first, 600 B, free the other two. Returns the addresses.
fn step(a: &CachingAllocator, sizes: [usize; 3]) -> [u64; 3] {
    let x = a.allocate_raw(sizes[0], S0).unwrap();
    let y = a.allocate_raw(sizes[1], S0).unwrap();
    let addrs = [x.addr(), y.addr()];
    a.free_raw(x).unwrap();
    let z = a.allocate_raw(sizes[2], S0).unwrap();
    let third = z.addr();
    a.free_raw(y).unwrap();
    a.free_raw(z).unwrap();
    a.check_invariants().unwrap();
    [addrs[0], addrs[1], third]
}

/// An allocator after two `step`s of 100, 1000 and 600 B and the marker after each: the plan
/// made from the first is active and served the second, its 2048 B bin at the start of the
/// small segment, whose address is returned.
fn planned_allocator() -> (Arc<SimBackend>, CachingAllocator, u64) {
    let (sim, a) = sim_alloc(AllocatorConfig::default());
    for _ in 0..2 {
        a.mark_step().unwrap();
        step(&a, [100, 1000, 600]);
    }
    a.mark_step().unwrap();
    let base = a.snapshot().segments[0].address;
    (sim, a, base)
}

#[test]
fn packing_into_bins_uses_the_smallest_bin_with_room() {
    let trace = Trace::parse("a 1 100\na 2 1000\nf 1\na 3 600\nf 2\nf 3\n").unwrap();
    // Blocks (rounded): 512 B live [0, 2), 1024 B [1, 4), 1024 B [3, 5); largest first.
    let plan = BinPlan::pack(&trace, &[4096, 1024, 512]).unwrap();
    assert_eq!(plan.places, vec![Some((2, 0)), Some((1, 0)), Some((0, 0))]);
    // One bin of 2048 B: as in one arena.
    let plan = BinPlan::pack(&trace, &[2048]).unwrap();
    assert_eq!(
        plan.places,
        vec![Some((0, 1024)), Some((0, 0)), Some((0, 1024))]
    );
    // No room for the second 1024 B block: the cache will serve it.
    let plan = BinPlan::pack(&trace, &[1536]).unwrap();
    assert_eq!(plan.places, vec![Some((0, 1024)), Some((0, 0)), None]);
    // Kept where `fixed` says, the rest around it.
    let fixed = [None, Some((0, 1024)), None];
    let plan = BinPlan::pack_around(&trace, &[2048], &fixed).unwrap();
    assert_eq!(
        plan.places,
        vec![Some((0, 0)), Some((0, 1024)), Some((0, 0))]
    );
}

#[test]
fn a_loop_is_planned_from_its_first_step_and_served_without_calls() {
    let (sim, a) = sim_alloc(AllocatorConfig::default());
    a.mark_step().unwrap();
    let first = step(&a, [100, 1000, 600]);
    a.mark_step().unwrap();
    // The small segment (2 MiB) was the only free block: 2048 B of it are the plan's bin.
    assert_eq!(a.plan_counts().1, 2048);
    let stats = a.memory_stats();
    assert_eq!(stats.reserved_bytes.all.current, 2 * MIB as i64);
    assert_eq!(
        stats.inactive_split_bytes.all.current,
        (2 * MIB - 2048) as i64
    );
    let calls = sim.calls();
    // The cache's step spans 2560 B (the 600 B block fits not in the 512 B the first one
    // left); the plan's 2048 B: the 1000 B block at the bin's start, the others after it.
    let base = a.snapshot().segments[0].address;
    assert_eq!(first, [base, base + 512, base + 1536]);
    for _ in 0..3 {
        let x = a.allocate_raw(100, S0).unwrap();
        let y = a.allocate_raw(1000, S0).unwrap();
        assert_eq!([x.addr(), y.addr()], [base + 1024, base]);
        let s = a.memory_stats();
        assert_eq!(
            (s.allocation.all.current, s.allocated_bytes.all.current),
            (2, 1536)
        );
        assert_eq!(s.requested_bytes.all.current, 1100);
        a.free_raw(x).unwrap();
        let z = a.allocate_raw(600, S0).unwrap();
        assert_eq!(z.addr(), base + 1024);
        a.check_invariants().unwrap();
        a.free_raw(y).unwrap();
        a.free_raw(z).unwrap();
        a.mark_step().unwrap();
    }
    assert_eq!(sim.calls(), calls);
    let (counts, bytes) = a.plan_counts();
    assert_eq!(
        (
            counts.planned_steps,
            counts.fallback_steps,
            counts.arena_allocs,
            bytes
        ),
        (3, 0, 9, 2048)
    );
    assert_eq!(a.memory_stats().allocated_bytes.all.current, 0);
}

#[test]
fn a_deviating_step_falls_back_and_the_plan_is_dropped() {
    let (_, a, base) = planned_allocator();
    let x = a.allocate_raw(100, S0).unwrap();
    assert_eq!(x.addr(), base + 1024);
    // 5000 B is not the plan's second request: the cache serves it (past the bin), and the
    // rest of the step too; the first block stays where the plan put it.
    let y = a.allocate_raw(5000, S0).unwrap();
    assert_eq!(y.addr(), base + 2048);
    let z = a.allocate_raw(1000, S0).unwrap();
    assert_eq!(z.addr(), base + 2048 + 5120);
    a.check_invariants().unwrap();
    for r in [x, y, z] {
        a.free_raw(r).unwrap();
    }
    a.mark_step().unwrap();
    let (counts, bytes) = a.plan_counts();
    assert_eq!(
        (counts.planned_steps, counts.fallback_steps, bytes),
        (1, 1, 0)
    );
    // The bin went back: the small segment is one free block again.
    assert_eq!(a.largest_free_block(), 2 * MIB);
    let s = a.memory_stats();
    assert_eq!(s.inactive_split.all.current, 0);
    // Nine blocks were handed out (two steps of three, then x, y and z), and a bin going back
    // is none of them.
    assert_eq!(
        (s.allocation.all.allocated, s.allocated_bytes.all.allocated),
        (9, 2 * (512 + 1024 + 1024) + 512 + 5120 + 1024)
    );
    assert_eq!(s.allocated_bytes.all.peak, 512 + 5120 + 1024);
    a.check_invariants().unwrap();
}

/// Another thread's allocations inside a step (a loader prefetching the next batch, a kernel's
/// workers taking scratch) come in an order of their own: the cache serves them, and they are
/// neither recorded nor a deviation, so the marking thread's steps are planned whatever the
/// other thread asks for.
#[test]
fn other_threads_allocate_from_the_cache_without_disturbing_the_plan() {
    let (sim, a) = sim_alloc(AllocatorConfig::default());
    let mut calls_after_step_1 = 0;
    for i in 0..6usize {
        a.mark_step().unwrap();
        let before = sim.calls().memory_calls();
        let x = a.allocate_raw(100, S0).unwrap();
        // A size that changes every step, between the marking thread's first two requests.
        let other = std::thread::scope(|s| {
            s.spawn(|| a.allocate_raw(4096 * (i + 1), S0).unwrap())
                .join()
                .unwrap()
        });
        let y = a.allocate_raw(1000, S0).unwrap();
        a.free_raw(other).unwrap();
        a.free_raw(x).unwrap();
        let z = a.allocate_raw(600, S0).unwrap();
        a.free_raw(y).unwrap();
        a.free_raw(z).unwrap();
        a.check_invariants().unwrap();
        if i >= 1 {
            calls_after_step_1 += sim.calls().memory_calls() - before;
        }
    }
    a.mark_step().unwrap();
    let (counts, bytes) = a.plan_counts();
    // Step 0 recorded, 1-5 served from the plan made from it.
    assert_eq!(
        (
            counts.planned_steps,
            counts.fallback_steps,
            counts.arena_allocs
        ),
        (5, 0, 15)
    );
    assert_eq!(bytes, 2048);
    assert_eq!(calls_after_step_1, 0);
}

/// Step 1 makes state in the middle of the step (kept, as an optimizer's or a lazily built
/// buffer's): later steps do not ask for it, and the plan skips its request; a request the
/// plan does not know, once every placed block was asked for, goes to the cache without
/// leaving the plan; one before that, which no skip explains, leaves it.
#[test]
fn requests_made_only_in_the_recorded_step_are_skipped_and_extra_ones_at_the_end_served() {
    let (sim, a) = sim_alloc(AllocatorConfig::default());
    a.mark_step().unwrap();
    let x = a.allocate_raw(100, S0).unwrap();
    let state = a.allocate_raw(300, S0).unwrap();
    let y = a.allocate_raw(1000, S0).unwrap();
    a.free_raw(x).unwrap();
    a.free_raw(y).unwrap();
    a.mark_step().unwrap();
    let calls = sim.calls().memory_calls();
    let mut places = Vec::new();
    for extra in [false, true, false] {
        let x = a.allocate_raw(100, S0).unwrap();
        let y = a.allocate_raw(1000, S0).unwrap();
        places.push([x.addr(), y.addr()]);
        a.free_raw(x).unwrap();
        a.free_raw(y).unwrap();
        if extra {
            let logged = a.allocate_raw(4000, S0).unwrap();
            a.free_raw(logged).unwrap();
        }
        a.check_invariants().unwrap();
        a.mark_step().unwrap();
    }
    assert!(places.iter().all(|p| *p == places[0]), "{places:x?}");
    let (counts, _) = a.plan_counts();
    assert_eq!(
        (
            counts.planned_steps,
            counts.fallback_steps,
            counts.arena_allocs
        ),
        (3, 0, 6)
    );
    assert_eq!(sim.calls().memory_calls(), calls);
    // 4000 B first is no skip of requests the cache served: the step leaves the plan.
    let w = a.allocate_raw(4000, S0).unwrap();
    a.free_raw(w).unwrap();
    a.mark_step().unwrap();
    assert_eq!(a.plan_counts().0.fallback_steps, 1);
    a.free_raw(state).unwrap();
    a.check_invariants().unwrap();
}

/// A Python training loop frees step N's batch only when step N+1 assigns the next one, and a
/// loop may keep a block for good (a logged loss): those blocks outlive their step, so the
/// cache serves them while the rest of the step is planned (default mode), at the same
/// addresses every step and with no backend call. With expandable segments such steps are not
/// planned (the bins would keep whole free pages from the blocks the cache serves).
#[test]
fn blocks_that_outlive_their_step_are_left_to_the_cache() {
    for config in [AllocatorConfig::default(), AllocatorConfig::expandable()] {
        let expandable = config.expandable_segments;
        let (sim, a) = sim_alloc(config);
        let mut batch: Option<RawAllocation> = None;
        let (mut kept, mut addrs) = (Vec::new(), Vec::new());
        let mut calls = 0;
        for i in 0..7 {
            a.mark_step().unwrap();
            let before = sim.calls().memory_calls();
            // The next batch comes before the last one is freed.
            let next = a.allocate_raw(4096, S0).unwrap();
            if let Some(last) = batch.replace(next) {
                a.free_raw(last).unwrap();
            }
            addrs.push(step(&a, [100, 1000, 600]));
            kept.push(a.allocate_raw(300, S0).unwrap());
            if i >= 2 {
                calls += sim.calls().memory_calls() - before;
            }
        }
        a.mark_step().unwrap();
        let (counts, _) = a.plan_counts();
        if expandable {
            assert_eq!(counts, planned::PlannedCounts::default());
        } else {
            // Step 0 recorded, 1-6 served from the plan made from it.
            assert_eq!((counts.planned_steps, counts.fallback_steps), (6, 0));
            assert_eq!(counts.arena_allocs, 6 * 3);
            assert!(addrs[1..].iter().all(|x| *x == addrs[1]), "{addrs:x?}");
            assert_eq!(calls, 0);
        }
        a.check_invariants().unwrap();
        for r in kept.into_iter().chain(batch) {
            a.free_raw(r).unwrap();
        }
        assert_eq!(a.memory_stats().allocated_bytes.all.current, 0);
        a.check_invariants().unwrap();
    }
}

/// The plan made from the first step is left at the second step's first request, and no step
/// repeats the one before it after that, so nothing is planned again.
#[test]
fn steps_that_change_shape_fall_back_once_and_are_not_planned_again() {
    let (sim, a) = sim_alloc(AllocatorConfig::default());
    for (i, n) in [100, 200, 300, 400].into_iter().enumerate() {
        a.mark_step().unwrap();
        step(&a, [n, 1000 + i, 600]);
    }
    a.mark_step().unwrap();
    let fell_back = planned::PlannedCounts {
        fallback_steps: 1,
        ..Default::default()
    };
    assert_eq!(a.plan_counts(), (fell_back, 0));
    // One small segment served every step: the plan reserved nothing.
    assert_eq!(sim.calls().memory_calls(), 1);
    assert_eq!(a.memory_stats().inactive_split.all.current, 0);
    // Without `planned_steps`, markers change nothing.
    let sim = Arc::new(SimBackend::new(1 << 30));
    let plain = CachingAllocator::new(Arc::clone(&sim), AllocatorConfig::default()).unwrap();
    for _ in 0..4 {
        plain.mark_step().unwrap();
        step(&plain, [100, 1000, 600]);
    }
    assert_eq!(plain.plan_counts().1, 0);
}

#[test]
fn a_planned_block_used_on_another_stream_outlives_its_step_and_keeps_its_bin() {
    let (sim, a, _) = planned_allocator();
    let x = a.allocate_raw(100, S0).unwrap();
    let y = a.allocate_raw(1000, S0).unwrap();
    a.record_stream(&y, StreamId(7)).unwrap();
    a.free_raw(x).unwrap();
    let z = a.allocate_raw(600, S0).unwrap();
    a.free_raw(y).unwrap();
    a.free_raw(z).unwrap();
    // The block used on stream 7 is pending: the plan is dropped but its bin stays.
    a.mark_step().unwrap();
    assert_eq!(a.plan_counts().0.fallback_steps, 1);
    assert_eq!(a.memory_stats().active.all.current, 1);
    a.check_invariants().unwrap();
    sim.complete_all_events();
    // The next allocation polls the event: the block and then the bin go back.
    let w = a.allocate_raw(64, S0).unwrap();
    assert_eq!(a.memory_stats().active.all.current, 1);
    a.free_raw(w).unwrap();
    assert_eq!(a.largest_free_block(), 2 * MIB);
    a.check_invariants().unwrap();
}

/// The plan holds for the stream it was recorded on: the planned size asked on another
/// stream is a deviation (the cache serves it from that stream's pool), and so is a step that
/// stops before its last planned allocation; at the next marker either drops the plan.
#[test]
fn another_stream_or_a_short_step_is_a_deviation() {
    let (_, a, base) = planned_allocator();
    let x = a.allocate_raw(100, S0).unwrap();
    assert_eq!(x.addr(), base + 1024);
    let y = a.allocate_raw(1000, StreamId(7)).unwrap();
    assert_eq!(y.stream(), StreamId(7));
    assert!(
        y.addr() >= base + 2 * MIB as u64,
        "stream 7 gets a segment of its own, not stream 0's bin at {base:#x}: {:#x}",
        y.addr()
    );
    a.free_raw(x).unwrap();
    a.free_raw(y).unwrap();
    a.check_invariants().unwrap();
    a.mark_step().unwrap();
    let (counts, bytes) = a.plan_counts();
    assert_eq!(
        (
            counts.planned_steps,
            counts.fallback_steps,
            counts.arena_allocs,
            bytes
        ),
        (1, 1, 4, 0)
    );

    // Planned again after two more repeats; this time the step ends after its first block.
    for _ in 0..2 {
        step(&a, [100, 1000, 600]);
        a.mark_step().unwrap();
    }
    assert_eq!(a.plan_counts().1, 2048);
    let x = a.allocate_raw(100, S0).unwrap();
    assert_eq!(x.addr(), base + 1024);
    a.free_raw(x).unwrap();
    a.mark_step().unwrap();
    let (counts, bytes) = a.plan_counts();
    assert_eq!(
        (counts.planned_steps, counts.fallback_steps, bytes),
        (1, 2, 0)
    );
    // The bin went back: stream 0's segment is one free block again.
    assert_eq!(a.memory_stats().inactive_split.all.current, 0);
    a.check_invariants().unwrap();
}

#[test]
fn planned_steps_is_a_setting() {
    let c = AllocatorConfig::parse("planned_steps:True,expandable_segments:True").unwrap();
    assert!(c.planned_steps && c.expandable_segments);
    let e = AllocatorConfig::parse("planned_steps:often").unwrap_err();
    assert!(e.to_string().contains("expected True or False"), "{e}");
}

/// Seeded random loops: a step template repeated with random deviations (another size, an
/// extra block, a block kept into the next step, a block used on another stream). After every
/// event the statistics equal a recomputation, no two live blocks overlap, and the allocation
/// and requested counts are those of the live blocks.
#[test]
fn random_loops_with_deviations_keep_memory_disjoint_and_statistics_true() {
    for seed in 0..12 {
        let config = match seed % 3 {
            0 => AllocatorConfig::default(),
            1 => AllocatorConfig::expandable(),
            _ => AllocatorConfig {
                page_stitching: true,
                ..AllocatorConfig::expandable()
            },
        };
        let (sim, a) = sim_alloc(config);
        let mut rng = SplitMix64(seed);
        let template: Vec<usize> = (0..24)
            .map(|_| match rng.range(0, 9) {
                0..=5 => rng.range(1, 300_000) as usize,
                _ => rng.range(300_000, 6 * MIB as u64) as usize,
            })
            .collect();
        let mut carried: Vec<RawAllocation> = Vec::new();
        let mut planned_steps = 0;
        for round in 0..40 {
            a.mark_step().unwrap();
            sim.complete_all_events();
            let deviate = rng.range(0, 9) < 2;
            let mut live: Vec<RawAllocation> = std::mem::take(&mut carried);
            for (i, &size) in template.iter().enumerate() {
                let size = if deviate && i == 11 {
                    size + 4096
                } else {
                    size
                };
                live.push(a.allocate_raw(size, S0).unwrap());
                if deviate && i == 5 {
                    live.push(a.allocate_raw(777, S0).unwrap());
                }
                // Free the oldest block every other allocation.
                if i % 2 == 1 && live.len() > 2 {
                    let r = live.remove(0);
                    if rng.range(0, 30) == 0 {
                        a.record_stream(&r, StreamId(3)).unwrap();
                    }
                    a.free_raw(r).unwrap();
                }
                check(&a, &live, seed, round);
            }
            if deviate && rng.range(0, 1) == 0 {
                carried.push(live.pop().unwrap());
            }
            for r in live {
                a.free_raw(r).unwrap();
            }
            check(&a, &carried, seed, round);
            planned_steps = a.plan_counts().0.planned_steps;
        }
        assert!(planned_steps > 0, "seed {seed}: never planned");
        assert!(
            a.plan_counts().0.fallback_steps > 0,
            "seed {seed}: never deviated"
        );
        for r in carried {
            a.free_raw(r).unwrap();
        }
        sim.complete_all_events();
        a.mark_step().unwrap();
        a.mark_step().unwrap();
        a.check_invariants().unwrap();
    }
}

fn check(a: &CachingAllocator, live: &[RawAllocation], seed: u64, round: usize) {
    if let Err(e) = a.check_invariants() {
        panic!("seed {seed}, round {round}: {e}");
    }
    let mut spans: Vec<(u64, u64)> = live
        .iter()
        .map(|r| (r.addr(), r.addr() + r.block_size() as u64))
        .collect();
    spans.sort_unstable();
    for w in spans.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "seed {seed}, round {round}: {w:#x?} overlap"
        );
    }
    let s = a.memory_stats();
    let requested: usize = live.iter().map(|r| r.size()).sum();
    assert_eq!(s.allocation.all.current as usize, live.len());
    assert_eq!(s.requested_bytes.all.current as usize, requested);
}
