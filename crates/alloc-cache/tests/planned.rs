//! Planned steps: interval packing of one step into an arena, exact offsets, serving repeated
//! steps from it and falling back on a deviating step.

use kiln_alloc_cache::planned::{steps_of, PlannedReplayer, StepPlan};
use kiln_alloc_cache::{replay, ReplayMode, Trace};

const STEP: &str = "a 1 100\na 2 1000\nf 1\na 3 600\nf 2\nf 3\n";

#[test]
fn packing_places_largest_first_at_the_lowest_free_offset() {
    let plan = StepPlan::pack(&Trace::parse(STEP).unwrap()).unwrap();
    // Blocks (rounded) and lifetimes in events: 1: 512 B [0, 2), 2: 1024 B [1, 4),
    // 3: 1024 B [3, 5). Block 2 goes first at 0; block 3 overlaps it in time: 1024; block 1
    // overlaps only block 2: 1024.
    assert_eq!(plan.requests, vec![100, 1000, 600]);
    assert_eq!(plan.offsets, vec![1024, 0, 1024]);
    assert_eq!((plan.arena_bytes, plan.peak_live_bytes), (2048, 2048));
}

#[test]
fn steps_that_repeat_are_served_from_the_arena_and_a_deviation_falls_back() {
    let plan = StepPlan::pack(&Trace::parse(STEP).unwrap()).unwrap();
    let mut r = PlannedReplayer::new(plan, ReplayMode::Default, 1 << 30).unwrap();
    let step = Trace::parse(STEP).unwrap();
    for _ in 0..3 {
        assert_eq!(r.run_step(&step).unwrap(), vec![1024, 0, 1024]);
    }
    assert_eq!(r.fallback().sim().calls().memory_calls(), 0);
    // The second allocation differs: the first stays in the arena, the rest goes to the
    // caching allocator, and the step completes.
    let other = Trace::parse("a 7 100\na 8 2000\nf 7\nf 8\n").unwrap();
    assert_eq!(r.run_step(&other).unwrap(), vec![1024]);
    let c = r.counts();
    assert_eq!(
        (c.planned_steps, c.fallback_steps, c.arena_allocs),
        (3, 1, 10)
    );
    let report = r.fallback().report();
    assert_eq!((report.events, report.peak_live_bytes), (2, 2000));
    assert_eq!(r.fallback().sim().calls().memory_calls(), 1);
}

#[test]
fn a_step_whose_block_outlives_it_cannot_be_planned() {
    let err = StepPlan::pack(&Trace::parse("a 1 10\na 2 20\nf 2\n").unwrap()).unwrap_err();
    assert!(
        err.to_string()
            .contains("id 1 is allocated in the step and still live"),
        "{err}"
    );
    let split = steps_of("a 1 10\n# step 1\nf 1\na 2 5\n").unwrap();
    let err = StepPlan::pack(&split[1]).unwrap_err();
    assert!(
        err.to_string()
            .contains("frees id 1, which it did not allocate"),
        "{err}"
    );
}

#[test]
fn recorded_resnet_steps_after_the_second_run_from_one_arena() {
    let text = include_str!("../traces/resnet18_sgd.trace");
    let steps = steps_of(text).unwrap();
    // Model creation, six steps (the last one ends with the frees of the model).
    assert_eq!(steps.len(), 7);
    let plan = StepPlan::pack(&steps[3]).unwrap();
    assert!(plan.arena_bytes >= plan.peak_live_bytes);
    assert!(
        (plan.arena_bytes as f64) < 1.05 * plan.peak_live_bytes as f64,
        "arena {} for peak {}",
        plan.arena_bytes,
        plan.peak_live_bytes
    );
    let mut r = PlannedReplayer::new(plan.clone(), ReplayMode::Default, 80 << 30).unwrap();
    for step in &steps[..3] {
        r.run_step(step).unwrap();
    }
    let calls = r.fallback().sim().calls().memory_calls();
    for step in &steps[3..6] {
        assert_eq!(r.run_step(step).unwrap(), plan.offsets);
    }
    // Step 2 already repeats step 3 (the optimizer state exists from step 1): it was served
    // from the arena too; model creation and step 1 went to the caching allocator.
    let c = r.counts();
    assert_eq!((c.planned_steps, c.fallback_steps), (4, 2));
    eprintln!(
        "resnet18_sgd step 3: arena {} B, peak live {} B, whole run reserves {} B",
        plan.arena_bytes,
        plan.peak_live_bytes,
        replay(&Trace::parse(text).unwrap(), ReplayMode::Default, 80 << 30)
            .unwrap()
            .peak_reserved_bytes
    );
    assert_eq!(r.fallback().sim().calls().memory_calls(), calls);
    // The step repacked is far below what the whole run reserves through the cache.
    let whole = replay(&Trace::parse(text).unwrap(), ReplayMode::Default, 80 << 30).unwrap();
    assert!(plan.arena_bytes < whole.peak_reserved_bytes);
}
