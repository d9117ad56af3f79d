//! The allocation traces the `alloc` group replays, compiled in so the bench also runs where
//! the source tree is absent (the GPU machine of `cargo xtask gpu-pack`): kiln's own recorded
//! runs, the same runs recorded from PyTorch, and the synthetic GPU-scale steps.

use kiln_alloc_cache::Trace;

/// The traces recorded from kiln's own CPU training runs (`cargo xtask record-traces`): the
/// figures of record, at CPU scale and at GPU-training scale (`*_gpu`, peaks of 2.4-2.8 GiB).
pub(super) const RECORDED: [(&str, &str); 8] = [
    (
        "resnet18_sgd",
        include_str!("../../../crates/alloc-cache/traces/resnet18_sgd.trace"),
    ),
    (
        "gpt_varlen_adamw",
        include_str!("../../../crates/alloc-cache/traces/gpt_varlen_adamw.trace"),
    ),
    (
        "finetune_resnet18_varbatch",
        include_str!("../../../crates/alloc-cache/traces/finetune_resnet18_varbatch.trace"),
    ),
    (
        "vit_adamw",
        include_str!("../../../crates/alloc-cache/traces/vit_adamw.trace"),
    ),
    (
        "resnet18_sgd_gpu",
        include_str!("../../../crates/alloc-cache/traces/resnet18_sgd_gpu.trace"),
    ),
    (
        "gpt_varlen_adamw_gpu",
        include_str!("../../../crates/alloc-cache/traces/gpt_varlen_adamw_gpu.trace"),
    ),
    (
        "finetune_resnet18_varbatch_gpu",
        include_str!("../../../crates/alloc-cache/traces/finetune_resnet18_varbatch_gpu.trace"),
    ),
    (
        "vit_adamw_gpu",
        include_str!("../../../crates/alloc-cache/traces/vit_adamw_gpu.trace"),
    ),
];

/// The same eight runs trained in PyTorch on the CPU, its allocations recorded by its profiler
/// (`crates/alloc-cache/traces/record_torch_traces.py`): the check on traces kiln did not make.
pub(super) const FROM_PYTORCH: [(&str, &str); 8] = [
    (
        "torch_resnet18_sgd",
        include_str!("../../../crates/alloc-cache/traces/torch_resnet18_sgd.trace"),
    ),
    (
        "torch_gpt_varlen_adamw",
        include_str!("../../../crates/alloc-cache/traces/torch_gpt_varlen_adamw.trace"),
    ),
    (
        "torch_finetune_resnet18_varbatch",
        include_str!("../../../crates/alloc-cache/traces/torch_finetune_resnet18_varbatch.trace"),
    ),
    (
        "torch_vit_adamw",
        include_str!("../../../crates/alloc-cache/traces/torch_vit_adamw.trace"),
    ),
    (
        "torch_resnet18_sgd_gpu",
        include_str!("../../../crates/alloc-cache/traces/torch_resnet18_sgd_gpu.trace"),
    ),
    (
        "torch_gpt_varlen_adamw_gpu",
        include_str!("../../../crates/alloc-cache/traces/torch_gpt_varlen_adamw_gpu.trace"),
    ),
    (
        "torch_finetune_resnet18_varbatch_gpu",
        include_str!(
            "../../../crates/alloc-cache/traces/torch_finetune_resnet18_varbatch_gpu.trace"
        ),
    ),
    (
        "torch_vit_adamw_gpu",
        include_str!("../../../crates/alloc-cache/traces/torch_vit_adamw_gpu.trace"),
    ),
];

/// The synthetic GPU-scale traces of `kiln_alloc_cache::synth` (tensors of 10-100 MiB, which
/// the CPU recordings do not reach in a CI budget).
pub(super) const SYNTHETIC: [(&str, &str); 4] = [
    (
        "synthetic_mlp_step_b1024",
        include_str!("../../../crates/alloc-cache/traces/mlp_step_b1024.trace"),
    ),
    (
        "synthetic_resnet18_step_b32",
        include_str!("../../../crates/alloc-cache/traces/resnet18_step_b32.trace"),
    ),
    (
        "synthetic_transformer_fixed_b8_t512",
        include_str!("../../../crates/alloc-cache/traces/transformer_fixed_b8_t512.trace"),
    ),
    (
        "synthetic_transformer_varlen_b8",
        include_str!("../../../crates/alloc-cache/traces/transformer_varlen_b8.trace"),
    ),
];

pub(super) fn read_traces() -> Result<Vec<(String, Trace)>, String> {
    RECORDED
        .iter()
        .chain(FROM_PYTORCH.iter())
        .chain(SYNTHETIC.iter())
        .map(|(name, text)| {
            Trace::parse(text)
                .map(|t| (name.to_string(), t))
                .map_err(|e| format!("{name}.trace: {e}"))
        })
        .collect()
}
