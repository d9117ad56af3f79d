//! The traces recorded from PyTorch's training runs (`traces/record_torch_traces.py`): the same
//! eight runs as kiln's own recordings, trained in PyTorch on the CPU with its allocations taken
//! from its profiler. They hold kiln's allocator to its figures on request streams kiln did not
//! make (a Python loop keeps the last batch alive into the next step; `torch.optim`'s per-tensor
//! loops, its default for CPU tensors; oneDNN convolutions; fused CPU attention).

mod common;

use kiln_alloc_cache::*;

/// Each recording, its step count, and upper bounds on reserved/live in default mode,
/// expandable mode and expandable mode with page stitching: the measured figures plus a
/// little room. Measured: 1.195 / 1.077 / 1.064, 1.232 / 1.029 / 1.029, 1.130 / 1.077 / 1.064,
/// 1.059 / 1.095 / 1.095, then at GPU scale 1.062 / 1.013 / 1.009, 1.482 / 1.007 / 1.004,
/// 1.023 / 1.013 / 1.009, 1.098 / 1.046 / 1.019.
const FROM_PYTORCH: [(&str, &str, usize, [f64; 3]); 8] = [
    (
        "resnet18_sgd",
        include_str!("../traces/torch_resnet18_sgd.trace"),
        6,
        [1.20, 1.08, 1.068],
    ),
    (
        "gpt_varlen_adamw",
        include_str!("../traces/torch_gpt_varlen_adamw.trace"),
        8,
        [1.236, 1.033, 1.033],
    ),
    (
        "finetune_resnet18_varbatch",
        include_str!("../traces/torch_finetune_resnet18_varbatch.trace"),
        8,
        [1.135, 1.08, 1.068],
    ),
    (
        "vit_adamw",
        include_str!("../traces/torch_vit_adamw.trace"),
        6,
        [1.063, 1.099, 1.099],
    ),
    (
        "resnet18_sgd_gpu",
        include_str!("../traces/torch_resnet18_sgd_gpu.trace"),
        6,
        [1.066, 1.017, 1.013],
    ),
    (
        "gpt_varlen_adamw_gpu",
        include_str!("../traces/torch_gpt_varlen_adamw_gpu.trace"),
        8,
        [1.486, 1.011, 1.008],
    ),
    (
        "finetune_resnet18_varbatch_gpu",
        include_str!("../traces/torch_finetune_resnet18_varbatch_gpu.trace"),
        8,
        [1.027, 1.017, 1.013],
    ),
    (
        "vit_adamw_gpu",
        include_str!("../traces/torch_vit_adamw_gpu.trace"),
        6,
        [1.102, 1.05, 1.023],
    ),
];

#[test]
fn pytorch_recordings_are_compact_whole_runs() {
    for (name, text, steps, _) in FROM_PYTORCH {
        let first = text.lines().next().unwrap();
        assert!(
            first.starts_with("# PyTorch ") && first.contains(&format!("--only {name} ")),
            "{name}: {first}"
        );
        // The script renumbers ids as `compact_recording` does: the files are already compact.
        assert_eq!(compact_recording(text).unwrap(), text, "{name}");
        let trace = Trace::parse(text).unwrap();
        let allocs = trace
            .events
            .iter()
            .filter(|e| matches!(e, TraceEvent::Alloc { .. }))
            .count();
        assert_eq!(allocs * 2, trace.events.len(), "{name}");
        let marks = text.lines().filter(|l| l.starts_with("# step ")).count();
        assert_eq!(marks, steps, "{name}");
        // The GPU-scale runs peak at several GiB, the CPU-scale ones at 100-400 MiB.
        let peak = trace.peak_live_bytes();
        if name.ends_with("_gpu") {
            assert!(peak > 1 << 30, "{name}: peak live {peak}");
        } else {
            assert!((100 << 20..400 << 20).contains(&peak), "{name}: {peak}");
        }
    }
}

#[test]
fn pytorch_recordings_fragment_within_their_measured_bounds() {
    for (name, text, _, bounds) in FROM_PYTORCH {
        common::assert_within_bounds(name, &Trace::parse(text).unwrap(), bounds);
    }
}

/// Where kiln's allocator reserves more than the model of PyTorch's own on PyTorch's traces
/// (measured): ViT-S/16 in default mode (1.098 against 1.052: the 112 MiB segment grown by the
/// last miss before the peak holds 75 MiB unused) and, by 1-6 thousandths, three GPU-scale
/// traces in expandable mode. Everywhere else kiln reserves no more than PyTorch's policy.
const BEHIND_PYTORCH: [(&str, ReplayMode); 4] = [
    ("vit_adamw_gpu", ReplayMode::Default),
    ("vit_adamw_gpu", ReplayMode::Expandable),
    ("resnet18_sgd_gpu", ReplayMode::Expandable),
    ("finetune_resnet18_varbatch_gpu", ReplayMode::Expandable),
];

#[test]
fn kiln_reserves_no_more_than_pytorchs_policy_but_where_measured() {
    let cap = replay::DEFAULT_REPLAY_CAPACITY;
    for (name, text, ..) in FROM_PYTORCH {
        let trace = Trace::parse(text).unwrap();
        for mode in [ReplayMode::Default, ReplayMode::Expandable] {
            let kiln = replay(&trace, mode, cap).unwrap().reserved_over_live;
            let torch = replay_with(&trace, ReplayPolicy::PyTorch, mode, cap)
                .unwrap()
                .reserved_over_live;
            let behind = BEHIND_PYTORCH.contains(&(name, mode));
            assert_eq!(
                kiln > torch,
                behind,
                "{name} {mode:?}: kiln {kiln:.4}, PyTorch's policy {torch:.4}; update \
                 BEHIND_PYTORCH with the new measurement"
            );
        }
    }
}

#[test]
fn pytorch_recordings_replayed_again_call_the_backend_no_more() {
    // The cache a whole run leaves serves the same run again: replays 2-3 make no call in
    // default mode (measured: none in replays 2-10 on all eight).
    for (name, text, ..) in FROM_PYTORCH {
        let trace = Trace::parse(text).unwrap();
        let mut r = Replayer::new(ReplayMode::Default, replay::DEFAULT_REPLAY_CAPACITY).unwrap();
        r.run(&trace).unwrap();
        let first = r.sim().calls().memory_calls();
        r.run(&trace).unwrap();
        r.run(&trace).unwrap();
        assert_eq!(r.sim().calls().memory_calls(), first, "{name}");
    }
}
