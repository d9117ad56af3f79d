//! The bugs `cargo xtask cpu-mutants` plants in the backward engine's rules that only some
//! graphs reach: a leaf frozen after the forward, backward inside an autocast scope, and the
//! reuse of a gradient's buffer (sums of two paths and the elementwise rules writing in place
//! only where no other handle, view or saved copy reaches the gradient, never into an expanded
//! view; sigmoid's and tanh's fused rules in PyTorch's order; the owned `into_relu` and
//! `into_add` writing over a tensor only where no one else sees it), and the memory plan's model of
//! them (one gradient in flight at ReLU, the forward counting an input already saved once);
//! each with the test meant to cover it.

use super::list::Mutant;

const MODELS: &str = "kiln-models";
const HISTORY: &[&str] = &["--test", "memory_history"];
const PLAN_BY_HISTORY: &str = "a_training_step_is_attributed_and_matches_the_plan";
const ELEMENTWISE_RULES: &str = "sigmoid_tanh_exp_and_log_backward_write_over_the_gradient";
const OWNED_OPS: &str = "owned_relu_and_add_reuse_a_buffer_only_when_no_one_else_sees_it";
const BACKWARD_SUM: &str =
    "a_sum_of_two_paths_goes_into_an_unshared_buffer_and_never_into_a_shared_one";

/// The planted bugs.
pub const MUTANTS: &[Mutant] = &[
    Mutant {
        bug: "a leaf frozen between forward and backward still gets a gradient",
        package: "kiln-autograd",
        file: "crates/autograd/src/autograd/engine.rs",
        find: "if leaf.requires_grad() {",
        replace: "if true {",
        target: &["--test", "autograd"],
        test: "a_leaf_frozen_after_the_forward_gets_no_gradient",
    },
    Mutant {
        bug: "backward called inside an autocast scope runs user backward code in 16 bits",
        package: "kiln-autograd",
        file: "crates/autograd/src/autograd/engine.rs",
        find: "let _no_autocast = crate::autocast::AutocastGuard::disabled();",
        replace: "",
        target: &["--test", "autocast"],
        test: "backward_inside_an_autocast_scope_runs_in_the_forwards_dtypes",
    },
    Mutant {
        bug: "backward adds a gradient into a buffer something else still holds",
        package: "kiln-autograd",
        file: "crates/autograd/src/inplace.rs",
        find: "let shared = Arc::strong_count(&self.0) > 1 || Arc::strong_count(self.storage_arc()) > 1;",
        replace: "let shared = false;",
        target: &["--test", "backward_in_place"],
        test: BACKWARD_SUM,
    },
    Mutant {
        bug: "backward adds a gradient into an expanded view of another",
        package: "kiln-autograd",
        file: "crates/autograd/src/inplace.rs",
        find: "&& self.is_contiguous()",
        replace: "",
        target: &["--test", "backward_in_place"],
        test: "expanded_gradients_meeting_are_summed_into_a_new_buffer",
    },
    Mutant {
        bug: "backward sums two paths' gradients into a third buffer",
        package: "kiln-autograd",
        file: "crates/autograd/src/autograd/engine.rs",
        find: "profile::timed(OpProfile::GRADIENT_SUM, || prev.into_add(&g))?\n                            }",
        replace: "profile::timed(OpProfile::GRADIENT_SUM, || prev.add(&g))?\n                            }",
        target: &["--test", "backward_in_place"],
        test: BACKWARD_SUM,
    },
    Mutant {
        bug: "an owned ReLU writes over a tensor someone else still holds",
        package: "kiln-autograd",
        file: "crates/autograd/src/ops/unary.rs",
        find: "if !self.reusable_alone() || !self.relu_in_place_supported() {",
        replace: "if !self.relu_in_place_supported() {",
        target: &["--test", "inplace"],
        test: OWNED_OPS,
    },
    Mutant {
        bug: "an owned op writes over a leaf that requires grad while a graph is built",
        package: "kiln-autograd",
        file: "crates/autograd/src/inplace.rs",
        find: "self.held_alone() && !recorded_leaf",
        replace: "self.held_alone()",
        target: &["--test", "inplace"],
        test: OWNED_OPS,
    },
    Mutant {
        bug: "ReLU's backward writes its result into a new buffer",
        package: "kiln-autograd",
        file: "crates/autograd/src/ops/unary.rs",
        find: "if self.updatable_alone_with(&saved) {",
        replace: "if false {",
        target: &["--test", "backward_in_place"],
        test: "relu_backward_writes_over_a_gradient_nobody_else_holds",
    },
    Mutant {
        bug: "sigmoid's backward multiplies in another order than PyTorch's kernel",
        package: "kiln-autograd",
        file: "crates/device/src/ops/elementwise/cpu.rs",
        find: "to.apply(|g: F, y: F| g * (one - y) * y)",
        replace: "to.apply(|g: F, y: F| g * ((one - y) * y))",
        target: &["--test", "backward_in_place"],
        test: ELEMENTWISE_RULES,
    },
    Mutant {
        bug: "tanh's backward goes back to three ops and two temporaries",
        package: "kiln-autograd",
        file: "crates/autograd/src/ops/unary.rs",
        find: "g.binary_raw(y, BinaryOp::TanhBackward)",
        replace: "g.mul(&y.mul(y)?.rsub_scalar(1.0)?)",
        target: &["--test", "backward_in_place"],
        test: ELEMENTWISE_RULES,
    },
    Mutant {
        bug: "the memory plan holds two gradients in flight at elementwise activations",
        package: MODELS,
        file: "crates/models/src/layers/activation.rs",
        find: "    tracer.input_grad_in_place();\n    out\n}",
        replace: "    out\n}",
        target: HISTORY,
        test: PLAN_BY_HISTORY,
    },
    Mutant {
        bug: "the memory plan counts a forward's input twice when it is saved",
        package: MODELS,
        file: "crates/models/src/plan.rs",
        find: "unsaved(e.input_bytes, e.input_saved)",
        replace: "e.input_bytes",
        target: HISTORY,
        test: PLAN_BY_HISTORY,
    },
];
