//! The bugs `cargo xtask cpu-mutants` plants in the rules of the allocator's planned steps
//! that only some loops reach: a loop planned from its first step, the spare bin of blocks
//! without room, other threads' allocations, requests made only in the recorded step or only
//! after it, the bins given back when the cache runs short or is emptied, the deviations
//! (another stream, a step that stops early, a plan dropped at a marker), the thread a CPU pass
//! runs on allocating for the thread that marks the steps, the plan's idle space lent to
//! kernel scratch, and its bins given back to work after the step; each with the test meant
//! to cover it.

use super::list::{Mutant, ALLOC, LIB};

const PLANNED: &[&str] = &["--test", "planned_steps"];
const LENDING: &[&str] = &["--test", "planned_lending"];
const REALIGN: &str =
    "requests_made_only_in_the_recorded_step_are_skipped_and_extra_ones_at_the_end_served";

/// The planted bugs.
pub const MUTANTS: &[Mutant] = &[
    Mutant {
        bug: "the planned size asked on another stream is served from the plan's bin",
        package: ALLOC,
        file: "crates/alloc-cache/src/planner.rs",
        find: "let asked = a.requests.get(i) == Some(&size) && a.stream == stream;",
        replace: "let asked = a.requests.get(i) == Some(&size);",
        target: PLANNED,
        test: "another_stream_or_a_short_step_is_a_deviation",
    },
    Mutant {
        bug: "a loop is planned only once two steps repeat, not from its first step",
        package: ALLOC,
        file: "crates/alloc-cache/src/planner.rs",
        find: "let first = !std::mem::replace(&mut p.recorded_before, true);",
        replace: "let first = !std::mem::replace(&mut p.recorded_before, true) && false;",
        target: PLANNED,
        test: "a_loop_is_planned_from_its_first_step_and_served_without_calls",
    },
    Mutant {
        bug: "planned steps record and place other threads' allocations too",
        package: ALLOC,
        file: "crates/alloc-cache/src/allocator.rs",
        find: ".is_some_and(|p| p.thread == crate::plan_state::current_thread());",
        replace: ".is_some();",
        target: PLANNED,
        test: "other_threads_allocate_from_the_cache_without_disturbing_the_plan",
    },
    Mutant {
        bug: "blocks no free block has room for get no spare bin",
        package: ALLOC,
        file: "crates/alloc-cache/src/planner.rs",
        find: "    if plan.places.iter().all(Option::is_some) {\n        return None;",
        replace: "    if true {\n        return None;",
        target: &["--test", "planned_spare"],
        test: "blocks_without_room_share_one_spare_segment_reserved_when_first_asked",
    },
    Mutant {
        bug: "a planned step that stops early keeps its plan",
        package: ALLOC,
        file: "crates/alloc-cache/src/plan_state.rs",
        find:
            "!self.deviated && self.next >= self.last_placed && self.live.len() == self.lent.len()",
        replace: "!self.deviated && self.live.len() == self.lent.len()",
        target: PLANNED,
        test: "another_stream_or_a_short_step_is_a_deviation",
    },
    Mutant {
        bug: "a plan dropped at a marker keeps its bins out of the pools",
        package: ALLOC,
        file: "crates/alloc-cache/src/planner.rs",
        find: "let release = a.live.is_empty();",
        replace: "let release = false;",
        target: PLANNED,
        test: "another_stream_or_a_short_step_is_a_deviation",
    },
    Mutant {
        bug: "a request made only in the recorded step is not skipped: the step leaves the plan",
        package: ALLOC,
        file: "crates/alloc-cache/src/plan_state.rs",
        find: "while k < self.requests.len() && self.requests[k] != size && self.cached(k) {",
        replace: "while false {",
        target: PLANNED,
        test: REALIGN,
    },
    Mutant {
        bug: "a request past the plan's last placed block leaves the plan",
        package: ALLOC,
        file: "crates/alloc-cache/src/plan_state.rs",
        find: "} else if i >= self.last_placed {",
        replace: "} else if false {",
        target: PLANNED,
        test: REALIGN,
    },
    Mutant {
        bug: "a plan short of memory keeps the bins holding live planned blocks whole",
        package: ALLOC,
        file: "crates/alloc-cache/src/segments.rs",
        find: "let yielded = st.dissolve_plan();",
        replace: "let yielded = st.yield_plan();",
        target: &["--test", "planned_pressure"],
        test: "a_plan_gives_the_free_parts_of_its_bins_back_when_the_cache_runs_short",
    },
    Mutant {
        bug: "empty_cache keeps the bins of a planned-steps plan",
        package: ALLOC,
        file: "crates/alloc-cache/src/segments.rs",
        find: "            st.dissolve_plan();\n            self.release_cached(st, Release::All)",
        replace: "            self.release_cached(st, Release::All)",
        target: &["--test", "planned_pressure"],
        test: "emptying_the_cache_or_trimming_it_releases_the_plan_s_bins",
    },
    Mutant {
        bug: "scratch beside a plan is never lent the plan's idle bin space",
        package: ALLOC,
        file: "crates/alloc-cache/src/plan_lend.rs",
        find: "if !serving_scratch(st) {",
        replace: "if true {",
        target: LENDING,
        test: "scratch_borrows_a_bin_that_no_planned_block_holds_and_maps_nothing",
    },
    Mutant {
        bug: "threads other than kernel scratch borrow the plan's bins too",
        package: ALLOC,
        file: "crates/alloc-cache/src/plan_lend.rs",
        find: "        && StepThread::current() == StepThread::OUTSIDE",
        replace: "",
        target: LENDING,
        test: "another_thread_that_is_not_scratch_borrows_nothing",
    },
    Mutant {
        bug: "scratch is lent the stretch whose next planned use comes first",
        package: ALLOC,
        file: "crates/alloc-cache/src/plan_lend.rs",
        find: "is_none_or(|(k, _)| key > *k)",
        replace: "is_none_or(|(k, _)| key < *k)",
        target: LENDING,
        test: "scratch_goes_where_the_next_planned_use_is_furthest_ahead",
    },
    Mutant {
        bug: "a planned block whose place a lent block holds makes the step deviate",
        package: ALLOC,
        file: "crates/alloc-cache/src/planner.rs",
        find: "if a.lent.contains(start) {",
        replace: "if false {",
        target: LENDING,
        test:
            "a_planned_block_whose_place_a_lent_block_holds_goes_to_the_cache_and_the_plan_goes_on",
    },
    Mutant {
        bug: "scratch beside a plan gets a segment padded with copies of itself",
        package: ALLOC,
        file: "crates/alloc-cache/src/segments.rs",
        find: "pool == PoolKind::Large && crate::plan_lend::serving_scratch(st)",
        replace: "pool == PoolKind::Large && crate::plan_lend::serving_scratch(st) && false",
        target: LENDING,
        test: "scratch_no_bin_can_hold_gets_a_segment_of_its_own_size_not_padded_copies",
    },
    Mutant {
        bug: "work after a planned step maps new memory beside the plan's idle bins",
        package: ALLOC,
        file: "crates/alloc-cache/src/allocator.rs",
        find: "let refit = match st.yield_plan_past_its_step(si, pool, rounded) {",
        replace: "let refit = match false {",
        target: LENDING,
        test: "work_after_the_last_planned_block_gets_the_idle_bins_not_new_memory",
    },
    Mutant {
        bug: "a step served whole counts as fallen back when work after it takes the bins",
        package: ALLOC,
        file: "crates/alloc-cache/src/plan_state.rs",
        find: "        if self.served_whole() {\n            counts.planned_steps += 1;",
        replace: "        if false {\n            counts.planned_steps += 1;",
        target: LENDING,
        test: "work_after_the_last_planned_block_gets_the_idle_bins_not_new_memory",
    },
    Mutant {
        bug: "another thread's miss after a planned step drops the plan",
        package: ALLOC,
        file: "crates/alloc-cache/src/planner.rs",
        find: "|| p.thread != crate::plan_state::current_thread()",
        replace: "|| false",
        target: LENDING,
        test: "another_thread_missing_after_the_step_leaves_the_plan_alone",
    },
    Mutant {
        bug: "work after a planned step drops the plan when no idle bin could hold it",
        package: ALLOC,
        file: "crates/alloc-cache/src/planner.rs",
        find: "        if !fits {\n            return false;",
        replace: "        if false {\n            return false;",
        target: LENDING,
        test: "work_after_the_step_that_no_idle_bin_could_hold_leaves_the_plan_alone",
    },
    Mutant {
        bug: "a thread that entered the marking thread's StepThread allocates as itself",
        package: ALLOC,
        file: "crates/alloc-cache/src/plan_state.rs",
        find: "    match ACTING_FOR.with(std::cell::Cell::get) {\n        0 =>",
        replace: "    match ACTING_FOR.with(std::cell::Cell::get) {\n        _ =>",
        target: &["--test", "planned_step_thread"],
        test: "a_pass_run_on_another_thread_is_planned_when_it_carries_the_marking_thread",
    },
    Mutant {
        bug: "the pool runs a CPU pass without the caller's planned-steps thread",
        package: "kiln-device",
        file: "crates/device/src/threads.rs",
        find: "let _step_thread = step_thread.enter();",
        replace: "let _step_thread = step_thread;",
        target: LIB,
        test: "threads::tests::the_pool_allocates_for_the_calling_thread_planned_steps",
    },
    Mutant {
        bug: "a convolution task's scratch counts as the pass's planned steps",
        package: "kiln-device",
        file: "crates/device/src/ops/conv/cpu_gemm.rs",
        find: "StepThread::OUTSIDE.enter(),",
        replace: "StepThread::current().enter(),",
        target: LIB,
        test: "ops::conv::cpu_gemm::tests::tasks_take_their_scratch_outside_planned_steps",
    },
];
