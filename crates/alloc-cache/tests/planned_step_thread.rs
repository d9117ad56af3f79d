//! Planned steps follow the thread that marks them, and a [`StepThread`] carries that thread
//! onto another one: a pass the marking thread hands whole to a worker (kiln's CPU passes run
//! on its pool) is planned as the marking thread's own, while what runs under
//! [`StepThread::OUTSIDE`] (a kernel's parallel scratch, whose count per thread changes from
//! step to step) is left to the cache without leaving the plan.

use kiln_alloc_cache::planned::PlannedCounts;
use kiln_alloc_cache::*;

mod planned_common;

use planned_common::{sim_alloc, S0};

/// What the worker of [`run_steps`] does in step `i`: the step's three blocks (100 B, 1000 B,
/// free the first, 600 B), with `scratch(i)` bytes taken and freed under
/// [`StepThread::OUTSIDE`] between the first two when it is not zero.
fn pass(a: &CachingAllocator, scratch: usize) {
    let x = a.allocate_raw(100, S0).unwrap();
    if scratch > 0 {
        let _outside = StepThread::OUTSIDE.enter();
        let s = a.allocate_raw(scratch, S0).unwrap();
        a.free_raw(s).unwrap();
    }
    let y = a.allocate_raw(1000, S0).unwrap();
    a.free_raw(x).unwrap();
    let z = a.allocate_raw(600, S0).unwrap();
    a.free_raw(y).unwrap();
    a.free_raw(z).unwrap();
}

/// Six steps, each marked on this thread and run by a new thread, which enters this thread's
/// [`StepThread`] when `carry`; returns the plan counts after the last marker.
fn run_steps(carry: bool, scratch: impl Fn(usize) -> usize + Sync) -> PlannedCounts {
    let (_sim, a) = sim_alloc(AllocatorConfig::default());
    for i in 0..6 {
        a.mark_step().unwrap();
        let marker = StepThread::current();
        std::thread::scope(|s| {
            s.spawn(|| {
                let _as_marker = carry.then(|| marker.enter());
                pass(&a, scratch(i));
            });
        });
        a.check_invariants().unwrap();
    }
    a.mark_step().unwrap();
    a.plan_counts().0
}

fn triple(c: PlannedCounts) -> (u64, u64, u64) {
    (c.planned_steps, c.fallback_steps, c.arena_allocs)
}

#[test]
fn a_pass_run_on_another_thread_is_planned_when_it_carries_the_marking_thread() {
    // Step 0 recorded; steps 1-5 served from the plan made from it, three blocks each.
    assert_eq!(triple(run_steps(true, |_| 0)), (5, 0, 15));
    // Not carried, the worker is another thread: nothing recorded, nothing planned.
    assert_eq!(triple(run_steps(false, |_| 0)), (0, 0, 0));
}

#[test]
fn scratch_taken_outside_the_steps_changes_nothing_in_the_plan() {
    // A scratch size that changes every step, and none at all in the recorded step.
    let scratch = |i: usize| if i == 0 { 0 } else { 4096 * i };
    assert_eq!(triple(run_steps(true, scratch)), (5, 0, 15));
}

#[test]
fn the_marking_thread_own_scratch_outside_the_steps_is_not_planned_either() {
    let (_sim, a) = sim_alloc(AllocatorConfig::default());
    for i in 0..4 {
        a.mark_step().unwrap();
        pass(&a, 512 * (i + 1));
    }
    a.mark_step().unwrap();
    assert_eq!(triple(a.plan_counts().0), (3, 0, 9));
}

#[test]
fn entering_sets_the_thread_and_dropping_restores_the_previous_one() {
    let own = StepThread::current();
    let other = std::thread::spawn(StepThread::current).join().unwrap();
    assert_ne!(own, other);
    assert_ne!(own, StepThread::OUTSIDE);
    {
        let _as_other = other.enter();
        assert_eq!(StepThread::current(), other);
        {
            let _outside = StepThread::OUTSIDE.enter();
            assert_eq!(StepThread::current(), StepThread::OUTSIDE);
        }
        assert_eq!(StepThread::current(), other);
    }
    assert_eq!(StepThread::current(), own);
}
