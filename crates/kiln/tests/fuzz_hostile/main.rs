//! The seeded, bounded fuzz suite for issue 18 ("no panic, abort or hang on any input"):
//! generated hostile inputs through the public API of kiln-sched, kiln-optim, kiln-data,
//! kiln-models, kiln-autograd, kiln-device, kiln-alloc-cache and kiln's memory picture, and
//! random op calls, autograd programs with shared buffers and in-place updates, indexing and
//! joining calls, reductions and views, multi-head attention
//! calls, convolution, pooling and normalisation calls, kiln-losses calls, optimizer runs and
//! `GradScaler` flows checked against references. Each target runs a fixed number of cases
//! from a fixed seed (the same cases on every run), fails on any panic (caught per case) or
//! wrong result (checked against a reference where one exists), and exits the process on a
//! case running past the harness's time limit. The harness lowers the process's address-space
//! limit to about 8 GB before the first case (`kiln_testkit::limit_address_space`), so an
//! allocation sized from input that slips through aborts the run instead of swapping:
//!
//! ```text
//! cargo test -p kiln --test fuzz_hostile -- --nocapture
//! ```
//!
//! `--nocapture` shows each target's counts (cases, accepted, refused, panics). For a longer
//! local hunt, `KILN_FUZZ_SCALE=N` multiplies every case count and `KILN_FUZZ_SEED=K` moves
//! every seed; CI sets neither.

mod attention;
mod conv_pool;
mod data;
mod events;
mod folders;
mod graph_programs;
mod graph_reference;
mod graph_steps;
mod harness;
mod index_reference;
mod indexing;
mod json_mutation;
mod layers;
mod loss_reference;
mod losses;
mod norms;
mod numeric;
mod ops;
mod optim;
mod optim_reference;
mod optim_runs;
mod parsers;
mod reduce_reference;
mod reduce_views;
mod reference;
mod scaler_flows;
mod sched;
mod snapshots;

#[test]
fn fuzz_scheduler_state_dicts() {
    sched::state_dicts(0x5eed_0001, 1500);
}

#[test]
fn fuzz_loader_states_and_configs() {
    data::loader_states(0x5eed_0002, 400);
}

#[test]
fn fuzz_mnist_idx_bytes() {
    data::mnist_files(0x5eed_0003, 300);
}

#[test]
fn fuzz_cifar10_batch_bytes() {
    data::cifar_files(0x5eed_0004, 300);
}

#[test]
fn fuzz_png_bytes_and_model_inputs() {
    data::png_files(0x5eed_0005, 300);
}

#[test]
fn fuzz_jpeg_bytes_and_model_inputs() {
    data::jpeg_files(0x5eed_001c, 600);
}

#[test]
fn fuzz_image_folder_trees() {
    folders::image_folder_trees(0x5eed_001d, 300);
}

#[test]
fn fuzz_strings() {
    parsers::strings(0x5eed_0006, 3000);
}

#[test]
fn fuzz_allocation_traces() {
    parsers::traces(0x5eed_0007, 400);
}

#[test]
fn fuzz_memory_plan_budgets() {
    parsers::budgets(0x5eed_0008, 600);
}

#[test]
fn fuzz_scheduler_constructors() {
    sched::constructors(0x5eed_0009, 1500);
}

#[test]
fn fuzz_random_ops_against_a_reference() {
    ops::random_ops(0x5eed_000a, 3000);
}

#[test]
fn fuzz_optimizer_state_dicts() {
    optim::optimizer_state_dicts(0x5eed_000b, 800);
}

#[test]
fn fuzz_grad_scaler_states() {
    optim::grad_scaler_states(0x5eed_000c, 600);
}

#[test]
fn fuzz_memory_snapshot_pickles() {
    snapshots::snapshot_pickles(0x5eed_000d, 1500);
}

#[test]
fn fuzz_allocator_settings() {
    parsers::allocator_settings(0x5eed_000e, 600);
}

#[test]
fn fuzz_launch_environments() {
    parsers::launch_environments(0x5eed_000f, 2000);
}

#[test]
fn fuzz_tensorboard_event_files() {
    events::tensorboard_events(0x5eed_0010, 1500);
}

#[test]
fn fuzz_layer_hyper_parameters() {
    layers::layer_configs(0x5eed_0011, 2000);
}

#[test]
fn fuzz_other_layers() {
    layers::other_layers(0x5eed_0012, 2000);
}

#[test]
fn fuzz_loss_calls() {
    losses::loss_calls(0x5eed_0013, 2000);
}

#[test]
fn fuzz_optimizer_runs() {
    optim_runs::optimizer_runs(0x5eed_0014, 1500);
}

#[test]
fn fuzz_conv_and_pool_calls() {
    conv_pool::conv_and_pool_calls(0x5eed_0015, 1500);
}

#[test]
fn fuzz_norm_calls() {
    norms::norm_calls(0x5eed_0016, 1500);
}

#[test]
fn fuzz_index_calls() {
    indexing::index_calls(0x5eed_0017, 4000);
}

#[test]
fn fuzz_attention_calls() {
    attention::attention_calls(0x5eed_0018, 2000);
}

#[test]
fn fuzz_grad_scaler_flows() {
    scaler_flows::scaler_flows(0x5eed_0019, 2000);
}

#[test]
fn fuzz_reduction_and_view_calls() {
    reduce_views::reduce_and_view_calls(0x5eed_001a, 6000);
}

#[test]
fn fuzz_autograd_programs() {
    graph_programs::graph_programs(0x5eed_001b, 3000);
}
