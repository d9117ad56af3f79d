//! Trace format, recorder, parser, the shipped traces and replay.
//!
//! `KILN_REGEN_TRACES=1 cargo test -p kiln-alloc-cache --test traces` rewrites the shipped
//! files from the generators in `kiln_alloc_cache::synth`.

mod common;

use kiln_alloc_cache::*;
use std::path::PathBuf;
use std::sync::Arc;

/// The shipped traces (embedded, so the test binary also runs where the source tree is absent,
/// e.g. the GPU machine) and the generator call that produces each.
fn shipped() -> Vec<(&'static str, &'static str, String)> {
    vec![
        (
            "resnet18_step_b32.trace",
            include_str!("../traces/resnet18_step_b32.trace"),
            synth::resnet18_step(32),
        ),
        (
            "transformer_varlen_b8.trace",
            include_str!("../traces/transformer_varlen_b8.trace"),
            synth::transformer_varlen(12, 8, 2024),
        ),
        (
            "transformer_fixed_b8_t512.trace",
            include_str!("../traces/transformer_fixed_b8_t512.trace"),
            synth::transformer_fixed(4, 8, 512),
        ),
        (
            "mlp_step_b1024.trace",
            include_str!("../traces/mlp_step_b1024.trace"),
            synth::mlp_step(1024, &[3072, 4096, 4096, 4096, 4096, 10]),
        ),
    ]
}

fn traces_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("traces")
}

#[test]
fn shipped_traces_match_their_generators() {
    let regen = std::env::var_os("KILN_REGEN_TRACES").is_some();
    for (name, on_disk, text) in shipped() {
        if regen {
            // The comparison below uses the copy compiled in: rerun without the variable.
            std::fs::write(traces_dir().join(name), &text).unwrap();
            continue;
        }
        assert!(
            on_disk == text,
            "{name} differs from its generator; run with KILN_REGEN_TRACES=1, then again without"
        );
        let trace = Trace::parse(on_disk).unwrap();
        assert!(trace.events.len() > 100);
        // Every allocation is freed, so the trace can be replayed back to back.
        let allocs = trace
            .events
            .iter()
            .filter(|e| matches!(e, TraceEvent::Alloc { .. }))
            .count();
        assert_eq!(allocs * 2, trace.events.len(), "{name}");
    }
}

#[test]
fn parser_accepts_the_format_and_names_bad_lines() {
    let t = Trace::parse("# a comment\n\na 1 100\na 2 5000\nf 1\na 1 7\nf 2\nf 1\n").unwrap();
    assert_eq!(t.events.len(), 6);
    assert_eq!(t.events[1], TraceEvent::Alloc { id: 2, bytes: 5000 });
    assert_eq!(t.peak_live_bytes(), 5100);
    assert_eq!(Trace::parse(&t.to_text()).unwrap(), t);
    let cases = [
        ("a 1 10\nf 2\n", 2, "id 2 is freed but not live"),
        (
            "a 1 10\na 1 20\n",
            2,
            "allocated again while live (allocated on line 1)",
        ),
        ("a 1\n", 1, "lacks the byte count"),
        ("a x 10\n", 1, "id `x` is not a non-negative integer"),
        ("m 1 10\n", 1, "is not an event"),
        ("f 1 2\n", 1, "not live"),
        ("a 1 10 3\n", 1, "unexpected `3`"),
    ];
    for (text, line, needle) in cases {
        match Trace::parse(text) {
            Err(Error::TraceParse { line: l, message }) => {
                assert_eq!(l, line, "{text:?}");
                assert!(message.contains(needle), "{text:?}: {message}");
            }
            other => panic!("{text:?}: expected a parse error, got {other:?}"),
        }
    }
}

#[test]
fn recorder_captures_an_allocator_run_and_replays_identically() {
    let sim = Arc::new(SimBackend::new(1 << 30));
    let a = Arc::new(CachingAllocator::new(Arc::clone(&sim), AllocatorConfig::default()).unwrap());
    a.set_trace_recorder(Some(TraceRecorder::new()));
    let x = a.allocate(1000, StreamId::DEFAULT).unwrap();
    let y = a.allocate(3 << 20, StreamId::DEFAULT).unwrap();
    let (xid, yid) = (x.id(), y.id());
    drop(x);
    let z = a.allocate(10, StreamId::DEFAULT).unwrap();
    let zid = z.id();
    drop((y, z));
    let rec = a.take_trace_recorder().unwrap();
    assert_eq!(rec.events(), 6);
    let expected =
        format!("a {xid} 1000\na {yid} 3145728\nf {xid}\na {zid} 10\nf {yid}\nf {zid}\n");
    assert_eq!(rec.as_str(), expected);
    let report = replay(
        &Trace::parse(rec.as_str()).unwrap(),
        ReplayMode::Default,
        1 << 30,
    )
    .unwrap();
    assert_eq!(report.events, 6);
    assert_eq!(report.peak_live_bytes, 1000 + (3 << 20));
    // A 2 MiB small segment and six copies of 3 MiB (18 MiB).
    assert_eq!(report.peak_reserved_bytes, (2 << 20) + (18 << 20));
    assert_eq!(
        (report.device_allocs, report.device_frees, report.ooms),
        (2, 0, 0)
    );
    let json = serde_json::to_value(&report).unwrap();
    for key in [
        "events",
        "peak_live_bytes",
        "peak_reserved_bytes",
        "reserved_over_live",
        "device_allocs",
        "device_frees",
        "alloc_retries",
        "ooms",
    ] {
        assert!(json.get(key).is_some(), "{key} missing from {json}");
    }
}

#[test]
fn replay_counts_ooms_and_skips_their_frees() {
    let trace = Trace::parse("a 1 30000000\na 2 30000000\nf 2\nf 1\n").unwrap();
    let report = replay(&trace, ReplayMode::Default, 40 << 20).unwrap();
    assert_eq!((report.ooms, report.events), (1, 4));
    assert_eq!(report.peak_live_bytes, 30000000);
    let report = replay(&trace, ReplayMode::Expandable, 40 << 20).unwrap();
    assert_eq!(report.ooms, 1);
    assert_eq!(
        report.peak_reserved_bytes,
        30 << 20,
        "whole 2 MiB pages for 28.6 MiB"
    );
    // Step by step: an allocation that failed in one step may be freed in the next (a batch
    // kept alive into the next step), and that free is skipped too.
    let text = "# step 1\na 1 30000000\na 2 30000000\n# step 2\nf 2\nf 1\n";
    let mut r = Replayer::new(ReplayMode::Default, 40 << 20).unwrap();
    r.run_steps(text).unwrap();
    assert_eq!((r.report().ooms, r.report().events), (1, 4));
    r.run_steps(text).unwrap();
    assert_eq!(r.report().ooms, 2);
}

#[test]
fn shipped_traces_replay_without_ooms_or_retries() {
    for (name, text, _) in shipped() {
        let trace = Trace::parse(text).unwrap();
        for mode in [ReplayMode::Default, ReplayMode::Expandable] {
            let r = replay(&trace, mode, replay::DEFAULT_REPLAY_CAPACITY).unwrap();
            assert_eq!((r.ooms, r.alloc_retries), (0, 0), "{name} {mode:?}");
            assert_eq!(r.peak_live_bytes, trace.peak_live_bytes());
            assert!(r.reserved_over_live >= 1.0, "{name} {mode:?}: {r:?}");
            eprintln!("{name} {mode:?}: {}", serde_json::to_string(&r).unwrap());
        }
    }
}

/// Upper bounds on `reserved_over_live` of each shipped trace (default, expandable): the
/// measured figures plus a little room. PyTorch's rules (what the default mode did before
/// defragmentation on a miss and geometric growth) gave 1.395 on ResNet-18, 1.158 on the
/// variable-length transformer, 1.059 on the fixed-length one and 1.202 on the MLP.
const FRAGMENTATION_BOUNDS: [(&str, f64, f64); 4] = [
    ("resnet18_step_b32.trace", 1.07, 1.025),
    ("transformer_varlen_b8.trace", 1.11, 1.005),
    ("transformer_fixed_b8_t512.trace", 1.06, 1.005),
    ("mlp_step_b1024.trace", 1.05, 1.05),
];

#[test]
fn shipped_traces_fragment_less_than_the_bounds() {
    let traces = shipped();
    assert_eq!(traces.len(), FRAGMENTATION_BOUNDS.len());
    for (name, default_bound, expandable_bound) in FRAGMENTATION_BOUNDS {
        let text = traces.iter().find(|(n, ..)| *n == name).unwrap().1;
        let trace = Trace::parse(text).unwrap();
        for (mode, bound) in [
            (ReplayMode::Default, default_bound),
            (ReplayMode::Expandable, expandable_bound),
        ] {
            let r = replay(&trace, mode, replay::DEFAULT_REPLAY_CAPACITY).unwrap();
            assert!(
                r.reserved_over_live <= bound,
                "{name} {mode:?}: reserved/live {:.4} above {bound}",
                r.reserved_over_live
            );
        }
    }
}

#[test]
fn fixed_shape_steps_replayed_ten_times_call_the_backend_only_in_the_first() {
    for (name, text, _) in shipped() {
        if name.contains("varlen") {
            continue;
        }
        fixed_shape_step_calls_the_backend_only_in_the_first(name, text, BOTH_MODES);
    }
}

const BOTH_MODES: &[ReplayMode] = &[ReplayMode::Default, ReplayMode::Expandable];

fn fixed_shape_step_calls_the_backend_only_in_the_first(
    name: &str,
    text: &str,
    modes: &[ReplayMode],
) {
    let trace = Trace::parse(text).unwrap();
    for &mode in modes {
        let mut r = Replayer::new(mode, replay::DEFAULT_REPLAY_CAPACITY).unwrap();
        r.run(&trace).unwrap();
        let after_first = r.sim().calls();
        assert!(
            after_first.memory_calls() > 5,
            "{name} {mode:?}: {after_first:?}"
        );
        for _ in 1..10 {
            r.run(&trace).unwrap();
        }
        assert_eq!(
            r.sim().calls(),
            after_first,
            "{name} {mode:?}: backend called after the first step"
        );
        assert_eq!(r.report().events, 10 * trace.events.len());
    }
}

/// The traces recorded from kiln's CPU training runs (`cargo xtask record-traces`): CPU-scale
/// and GPU-scale (`*_gpu`), with their step counts.
const RECORDED: [(&str, &str, usize); 8] = [
    (
        "resnet18_sgd",
        include_str!("../traces/resnet18_sgd.trace"),
        6,
    ),
    (
        "gpt_varlen_adamw",
        include_str!("../traces/gpt_varlen_adamw.trace"),
        8,
    ),
    (
        "finetune_resnet18_varbatch",
        include_str!("../traces/finetune_resnet18_varbatch.trace"),
        8,
    ),
    ("vit_adamw", include_str!("../traces/vit_adamw.trace"), 6),
    (
        "resnet18_sgd_gpu",
        include_str!("../traces/resnet18_sgd_gpu.trace"),
        6,
    ),
    (
        "gpt_varlen_adamw_gpu",
        include_str!("../traces/gpt_varlen_adamw_gpu.trace"),
        8,
    ),
    (
        "finetune_resnet18_varbatch_gpu",
        include_str!("../traces/finetune_resnet18_varbatch_gpu.trace"),
        8,
    ),
    (
        "vit_adamw_gpu",
        include_str!("../traces/vit_adamw_gpu.trace"),
        6,
    ),
];

#[test]
fn recorded_traces_are_whole_runs_that_free_everything() {
    for (name, text, steps) in RECORDED {
        let trace = Trace::parse(text).unwrap();
        let allocs = trace
            .events
            .iter()
            .filter(|e| matches!(e, TraceEvent::Alloc { .. }))
            .count();
        assert_eq!(allocs * 2, trace.events.len(), "{name}");
        let marks = text.lines().filter(|l| l.starts_with("# step ")).count();
        assert_eq!(marks, steps, "{name}");
        assert!(text.len() < 2 << 20, "{name} is {} bytes", text.len());
        // Ids are dense: never more than the blocks live at once.
        let max_id = trace
            .events
            .iter()
            .map(|e| match *e {
                TraceEvent::Alloc { id, .. } | TraceEvent::Free { id } => id,
            })
            .max()
            .unwrap();
        assert!(
            max_id < allocs as u64 / 2,
            "{name}: id {max_id} of {allocs}"
        );
    }
}

#[test]
fn compact_recording_drops_foreign_frees_renumbers_and_closes() {
    let recorded = "# header\na 70 100\nf 3\na 71 200\nf 70\n# step 2\na 72 300\n";
    let out = compact_recording(recorded).unwrap();
    assert_eq!(
        out,
        "# header\na 1 100\na 2 200\nf 1\n# step 2\na 1 300\n\
         # 2 blocks still live at the end, freed here\nf 1\nf 2\n"
    );
    let err = compact_recording("a 5 10\na 5 10\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("line 2") && err.contains("allocated again"),
        "{err}"
    );
    let err = compact_recording("f x\n").unwrap_err().to_string();
    assert!(
        err.contains("line 1") && err.contains("not a non-negative integer"),
        "{err}"
    );
}

/// Upper bounds on `reserved_over_live` of each recorded trace (default, expandable): the
/// measured figures plus a little room. Before the policy changes of the small pool (up to
/// 1 MiB) and of segment sizing they were 1.243 / 1.124, 1.157 / 1.225, 1.256 / 1.104 and
/// 1.273 / 1.085 (on the recordings made before session 7's convolution and matmul changes).
/// The recordings of session 40 (after in-place ReLUs and residual sums) measured 1.072 / 1.033,
/// 1.043 / 1.117, 1.136 / 1.054 and 1.132 / 1.132; session 46's GPT and ViT recordings (a
/// product or quotient keeps only what a gradient reads, so their peak of live bytes fell by
/// 9% and 4%) measured 1.052 / 1.139 and 1.126 / 1.061. Session 50's (a batch of matrices
/// times one matrix runs as one product, so no weight gradient is made per batch and summed)
/// measure 1.047 / 1.047 and 1.192 / 1.069: the ViT's peak of live bytes fell by 7%, from 122.6
/// to 114.1 MiB, while its default reserve fell only from 138 to 136 MiB.
const RECORDED_BOUNDS: [(&str, f64, f64); 4] = [
    ("resnet18_sgd", 1.076, 1.037),
    ("gpt_varlen_adamw", 1.051, 1.051),
    ("finetune_resnet18_varbatch", 1.14, 1.058),
    ("vit_adamw", 1.196, 1.073),
];

/// The recorded traces and modes where the model of PyTorch's policy reserves less than kiln:
/// the fine-tune in default mode (1.123 against kiln's 1.136): one 2 MiB segment. Both reserve
/// 164 MiB at the run's peak of 146 MiB live; kiln's peak of 166 MiB comes later, with 108 MiB
/// live, when a 208 KiB request finds its small pool full.
const PYTORCH_AHEAD: [(&str, ReplayMode); 1] =
    [("finetune_resnet18_varbatch", ReplayMode::Default)];

#[test]
fn recorded_traces_fragment_less_than_the_bounds_and_pytorch() {
    for (name, default_bound, expandable_bound) in RECORDED_BOUNDS {
        let text = RECORDED.iter().find(|(n, ..)| *n == name).unwrap().1;
        let trace = Trace::parse(text).unwrap();
        for (mode, bound) in [
            (ReplayMode::Default, default_bound),
            (ReplayMode::Expandable, expandable_bound),
        ] {
            let cap = replay::DEFAULT_REPLAY_CAPACITY;
            let r = replay(&trace, mode, cap).unwrap();
            assert!(
                r.reserved_over_live <= bound,
                "{name} {mode:?}: reserved/live {:.4} above {bound}",
                r.reserved_over_live
            );
            let torch = replay_with(&trace, ReplayPolicy::PyTorch, mode, cap).unwrap();
            let kiln_ahead = r.reserved_over_live <= torch.reserved_over_live;
            assert_eq!(
                kiln_ahead,
                !PYTORCH_AHEAD.contains(&(name, mode)),
                "{name} {mode:?}: kiln {:.4}, PyTorch's policy {:.4} (update PYTORCH_AHEAD)",
                r.reserved_over_live,
                torch.reserved_over_live
            );
            assert_eq!((r.ooms, r.alloc_retries), (0, 0), "{name} {mode:?}");
        }
    }
}

#[test]
fn recorded_fixed_shape_runs_replayed_ten_times_call_the_backend_only_in_the_first() {
    for (name, text, _) in RECORDED {
        // The ResNet runs are fixed-shape too, but in expandable mode a whole-run replay after
        // the first (which starts from a cache of free pages, not an empty one, so the model's
        // parameters land elsewhere) needs one more page once: one map call in replays 2-10
        // (measured; examples/policy_check.rs). Only their default mode is held to none.
        let modes: &[ReplayMode] = match name {
            "vit_adamw" | "vit_adamw_gpu" => BOTH_MODES,
            "resnet18_sgd" | "resnet18_sgd_gpu" => &[ReplayMode::Default],
            _ => continue,
        };
        fixed_shape_step_calls_the_backend_only_in_the_first(name, text, modes);
    }
}

/// Upper bounds on `reserved_over_live` of the GPU-scale recordings (default, expandable,
/// expandable with page stitching): the measured figures plus a little room. They are 1.070 /
/// 1.004 / 1.004, 1.125 / 1.111 / 1.008, 1.058 / 1.005 / 1.002 and 1.118 / 1.035 / 1.015; the
/// model of PyTorch's policy gives 1.269 / 1.006, 1.073 / 1.102, 1.352 / 1.013 and 1.094 / 1.033.
/// (Session 50's GPT and ViT recordings, with a batch of matrices times one matrix run as one
/// product, moved the GPT's expandable figure from 1.078 and the ViT's default from 1.087: the
/// ViT's peak of live bytes fell from 2500 to 2430 MiB and its default reserve stayed at 2718.)
/// (Session 46's GPT and ViT recordings, whose peaks of live bytes fell by 22% and 12% when
/// products and quotients stopped keeping what no gradient reads, moved the GPT's default from
/// 1.060 to 1.125 while its peak reserved fell from 3567 to 2956 MiB.)
/// (Before session 40's recordings, kiln's default on the ResNet and fine-tune runs was 1.058
/// and 1.021: the runs' placement is chaotic, and in-place ReLUs moved it.)
const GPU_SCALE_BOUNDS: [(&str, [f64; 3]); 4] = [
    ("resnet18_sgd_gpu", [1.074, 1.008, 1.008]),
    ("gpt_varlen_adamw_gpu", [1.129, 1.115, 1.012]),
    ("finetune_resnet18_varbatch_gpu", [1.062, 1.009, 1.006]),
    ("vit_adamw_gpu", [1.122, 1.039, 1.019]),
];

#[test]
fn gpu_scale_recordings_stay_within_their_measured_bounds() {
    for (name, bounds) in GPU_SCALE_BOUNDS {
        let text = RECORDED.iter().find(|(n, ..)| *n == name).unwrap().1;
        let trace = Trace::parse(text).unwrap();
        // Several GiB at the peak: GPU-training scale, not the CPU runs' 123-321 MiB.
        assert!(trace.peak_live_bytes() > 2 << 30, "{name}");
        common::assert_within_bounds(name, &trace, bounds);
    }
}
