//! Planned steps when memory runs short or is given back: the plan gives its bins back at
//! once, a bin still holding planned blocks dissolved around them; `empty_cache` and
//! `trim_to` release the bins' memory; random loops on a tight device keep memory disjoint
//! and statistics true through it.

use kiln_alloc_cache::synth::SplitMix64;
use kiln_alloc_cache::*;

mod planned_common;

use planned_common::{planned_on, MIB, S0};

/// When the cache runs short, the plan gives its bins back at once, a bin still holding planned
/// blocks dissolved around them: the 16 MiB request is served from the free part of the bin
/// that a live planned block keeps (the device has no room for another segment), and the
/// planned block keeps its address and is freed as any block.
#[test]
fn a_plan_gives_the_free_parts_of_its_bins_back_when_the_cache_runs_short() {
    let (_, a) = planned_on(24 * MIB, AllocatorConfig::default());
    a.mark_step().unwrap();
    let big = a.allocate_raw(24 * MIB, S0).unwrap();
    let base = big.addr();
    a.free_raw(big).unwrap();
    let small = a.allocate_raw(4 * MIB, S0).unwrap();
    a.free_raw(small).unwrap();
    a.mark_step().unwrap();
    assert_eq!(
        a.plan_counts().1,
        24 * MIB,
        "the whole segment is the plan's bin"
    );
    let big = a.allocate_raw(24 * MIB, S0).unwrap();
    a.free_raw(big).unwrap();
    let small = a.allocate_raw(4 * MIB, S0).unwrap();
    assert_eq!(small.addr(), base);
    // Past the plan's last block: the cache's, and only the bin's free part has room.
    let extra = a.allocate_raw(16 * MIB, S0).unwrap();
    assert_eq!(extra.addr(), base + 4 * MIB as u64);
    assert_eq!(
        a.memory_stats().reserved_bytes.all.current,
        24 * MIB as i64,
        "the device refused a second segment"
    );
    let (counts, bytes) = a.plan_counts();
    assert_eq!((counts.fallback_steps, bytes), (1, 0));
    let s = a.memory_stats();
    assert_eq!(s.allocated_bytes.all.current, 20 * MIB as i64);
    assert_eq!(s.allocated_bytes.all.peak, 24 * MIB as i64);
    a.check_invariants().unwrap();
    a.free_raw(small).unwrap();
    a.free_raw(extra).unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.largest_free_block(), 24 * MIB);
    assert_eq!(a.memory_stats().allocated_bytes.all.current, 0);
}

/// One step of 24 MiB and 4 MiB, each freed at once.
fn step(a: &CachingAllocator) {
    let big = a.allocate_raw(24 * MIB, S0).unwrap();
    a.free_raw(big).unwrap();
    let small = a.allocate_raw(4 * MIB, S0).unwrap();
    a.free_raw(small).unwrap();
}

/// What the plan keeps for the next step is cached memory: `empty_cache` drops the plan and
/// releases its bins' segment (PyTorch users call it to hand memory back, as kiln's recipe does
/// after validation), and `trim_to` does when nothing else gets it under its target. The step
/// under way is counted as at a marker: served whole, as planned; not begun, as neither. The
/// loop is planned again once two steps repeat.
#[test]
fn emptying_the_cache_or_trimming_it_releases_the_plan_s_bins() {
    for trim in [false, true] {
        let (sim, a) = planned_on(1 << 30, AllocatorConfig::default());
        // Step 1 recorded and planned at once; step 2 served from the plan.
        for _ in 0..2 {
            a.mark_step().unwrap();
            step(&a);
        }
        if trim {
            // Step 2 counted at its marker; step 3 has not begun.
            a.mark_step().unwrap();
        }
        assert_eq!(a.plan_counts().1, 24 * MIB, "the segment is the plan's bin");
        let released = if trim {
            a.trim_to(0).unwrap()
        } else {
            a.empty_cache().unwrap()
        };
        assert_eq!(released, 24 * MIB, "trim {trim}");
        assert_eq!(
            a.memory_stats().reserved_bytes.all.current,
            0,
            "trim {trim}"
        );
        assert_eq!(sim.used_bytes(), 0, "trim {trim}");
        let (counts, bins) = a.plan_counts();
        assert_eq!(
            (counts.planned_steps, counts.fallback_steps, bins),
            (1, 0, 0)
        );
        a.check_invariants().unwrap();
        if !trim {
            a.mark_step().unwrap();
        }
        // Two steps repeat: planned again, the third served.
        for _ in 0..3 {
            step(&a);
            a.mark_step().unwrap();
        }
        assert_eq!(a.plan_counts().0.planned_steps, 2, "trim {trim}");
        a.check_invariants().unwrap();
    }
}

/// Seeded loops of a step template with random deviations on a device a little larger than
/// the template's live bytes, so allocations fail and plans are given back under pressure:
/// after every event no two live blocks overlap and the statistics equal a recomputation.
#[test]
fn random_loops_on_a_tight_device_keep_memory_disjoint_and_statistics_true() {
    let mut pressed = 0;
    for seed in 0..8 {
        let (_, a) = planned_on(64 * MIB, AllocatorConfig::default());
        let mut rng = SplitMix64(seed);
        let template: Vec<usize> = (0..16)
            .map(|_| rng.range(MIB as u64, 8 * MIB as u64) as usize)
            .collect();
        for _ in 0..30 {
            a.mark_step().unwrap();
            let mut live: Vec<RawAllocation> = Vec::new();
            // One step in four asks for 8 MiB more at one random place.
            let grown = (rng.range(0, 4) == 0).then(|| rng.range(0, 16) as usize);
            for (i, &size) in template.iter().enumerate() {
                let size = if grown == Some(i) {
                    size + 8 * MIB
                } else {
                    size
                };
                if let Ok(r) = a.allocate_raw(size, S0) {
                    live.push(r);
                }
                if i % 2 == 1 && live.len() > 2 {
                    a.free_raw(live.remove(0)).unwrap();
                }
                a.check_invariants().unwrap();
                let mut spans: Vec<(u64, u64)> = live
                    .iter()
                    .map(|r| (r.addr(), r.addr() + r.block_size() as u64))
                    .collect();
                spans.sort_unstable();
                assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "seed {seed}");
            }
            for r in live {
                a.free_raw(r).unwrap();
            }
            a.check_invariants().unwrap();
        }
        let s = a.memory_stats();
        assert_eq!(s.allocated_bytes.all.current, 0, "seed {seed}");
        pressed += u64::from(s.num_alloc_retries > 0 && a.plan_counts().0.arena_allocs > 0);
    }
    assert!(pressed >= 4, "{pressed} of 8 seeds planned and ran short");
}
