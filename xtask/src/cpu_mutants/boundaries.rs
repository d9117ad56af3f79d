//! The bugs `cargo xtask cpu-mutants` plants at exact size boundaries that only a case sized to
//! them reaches: the model of PyTorch's allocator (the small pool's 1 MiB limit, the small
//! pool's smallest split, `max_split_size`'s oversize blocks), the out-of-memory report's choice
//! of advice, the CPU convolution's sum of per-thread weight gradients (blocks of output
//! channels that must not span two groups) and its tap-by-tap weight gradient's taps of a
//! non-square kernel, and the host page mapping's refusals (a length that is no whole number
//! of pages, a page that is an alias); each with the test meant to cover it.

use super::list::{Mutant, ALLOC, LIB};

const POLICY: &[&str] = &["--test", "pytorch_policy"];
const POLICY_SIZES: &str = "every_size_rule_holds_at_its_exact_boundary";
const OOM_ADVICE: &[&str] = &["--test", "oom_advice"];
const ADVICE_BOUNDARIES: &str = "each_advice_is_chosen_at_its_exact_boundary";
const HOST_PAGES: &[&str] = &["--test", "host_pages"];
const HOST_REFUSALS: &str = "a_refused_call_changes_nothing";
const HOST_PAGES_FILE: &str = "crates/alloc-cache/src/backend/host_pages.rs";
const POLICY_MAX_SPLIT: &str =
    "the_max_split_size_rules_of_pytorchs_policy_hold_at_their_boundaries";

/// The planted bugs.
pub const MUTANTS: &[Mutant] = &[
    Mutant {
        bug: "PyTorch's policy model sends a 1 MiB request to the large pool",
        package: ALLOC,
        file: "crates/alloc-cache/src/pytorch_policy.rs",
        find: "usize::from(size > SMALL_SIZE)",
        replace: "usize::from(size >= SMALL_SIZE)",
        target: POLICY,
        test: POLICY_SIZES,
    },
    Mutant {
        bug: "PyTorch's policy model keeps a 512 B rest of a small block unsplit",
        package: ALLOC,
        file: "crates/alloc-cache/src/pytorch_policy.rs",
        find: "remaining >= MIN_BLOCK\n",
        replace: "remaining > MIN_BLOCK\n",
        target: POLICY,
        test: POLICY_SIZES,
    },
    Mutant {
        bug: "PyTorch's policy model hands a block of exactly max_split_size to a smaller request",
        package: ALLOC,
        file: "crates/alloc-cache/src/pytorch_policy.rs",
        find: "(size < self.max_split && found >= self.max_split)",
        replace: "(size < self.max_split && found > self.max_split)",
        target: POLICY,
        test: POLICY_MAX_SPLIT,
    },
    Mutant {
        bug: "the out-of-memory advice blames an outside limit only above the smallest reservation",
        package: ALLOC,
        file: "crates/alloc-cache/src/error.rs",
        find: "if self.backend_free >= self.min_reservation {",
        replace: "if self.backend_free > self.min_reservation {",
        target: OOM_ADVICE,
        test: ADVICE_BOUNDARIES,
    },
    Mutant {
        bug: "the out-of-memory advice misses free pieces adding up to exactly the request",
        package: ALLOC,
        file: "crates/alloc-cache/src/error.rs",
        find: "self.reserved_unallocated.saturating_add(self.backend_free) >= self.rounded",
        replace: "self.reserved_unallocated.saturating_add(self.backend_free) > self.rounded",
        target: OOM_ADVICE,
        test: ADVICE_BOUNDARIES,
    },
    Mutant {
        bug: "the weight gradient's partials are summed in blocks that span two groups",
        package: "kiln-device",
        file: "crates/device/src/ops/conv/cpu_gemm.rs",
        find: "let block = gcd(outs, SUM_BLOCK);",
        replace: "let block = SUM_BLOCK.min(outs);",
        target: LIB,
        test: "ops::conv::cpu_gemm::tests::partials_are_summed_and_transposed_per_group",
    },
    Mutant {
        bug: "the tap-by-tap weight gradient walks a non-square kernel's taps transposed",
        package: "kiln-device",
        file: "crates/device/src/ops/conv/cpu_weight_taps.rs",
        find: "gather_tap(g, [t / kw, t % kw], nhwc, cols);",
        replace: "gather_tap(g, [t % kh, t / kh], nhwc, cols);",
        target: LIB,
        test:
            "ops::conv::cpu_weight_taps::tests::tap_by_tap_weight_gradient_equals_the_plain_loops",
    },
    Mutant {
        bug: "the host page mapping accepts a length that is no whole number of pages",
        package: ALLOC,
        file: HOST_PAGES_FILE,
        find: "!bytes.is_multiple_of(page)",
        replace: "false",
        target: HOST_PAGES,
        test: HOST_REFUSALS,
    },
    Mutant {
        bug: "the host page mapping maps over a page that is an alias",
        package: ALLOC,
        file: HOST_PAGES_FILE,
        find: ".find(|a| self.mapped.contains_key(a) || self.aliases.contains_key(a))",
        replace: ".find(|a| self.mapped.contains_key(a))",
        target: HOST_PAGES,
        test: HOST_REFUSALS,
    },
];
