//! How a policy fares beyond the shipped traces: every trace with every allocation scaled by
//! 21 factors from 0.50 to 1.50 (as another batch size or width would), replayed in each mode;
//! prints mean and worst peak reserved / peak live, and the backend memory calls of replays 2
//! and 3 summed over the scaled traces, per trace and over all. The figures of record are
//! tuned on nothing but the shipped traces; this shows whether a change of policy helps in
//! general or only moves the loss between traces (the placement is chaotic).
//!
//! `cargo run --release -p kiln-alloc-cache --example policy_sweep`

mod common;

use kiln_alloc_cache::replay::DEFAULT_REPLAY_CAPACITY;
use kiln_alloc_cache::{AllocatorConfig, Replayer, Trace, TraceEvent};

fn scaled(trace: &Trace, factor: f64) -> Trace {
    let events = trace
        .events
        .iter()
        .map(|e| match *e {
            TraceEvent::Alloc { id, bytes } => TraceEvent::Alloc {
                id,
                bytes: (bytes as f64 * factor) as usize,
            },
            other => other,
        })
        .collect();
    Trace { events }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let paths = common::shipped_traces()?;
    let modes = [
        ("default", AllocatorConfig::default()),
        ("expandable", AllocatorConfig::expandable()),
        (
            "stitching",
            AllocatorConfig {
                page_stitching: true,
                ..AllocatorConfig::expandable()
            },
        ),
    ];
    let factors: Vec<f64> = (0..=20).map(|i| 0.5 + 0.05 * i as f64).collect();
    for (mode, config) in &modes {
        let (mut all_sum, mut all_n, mut all_max) = (0.0, 0, 0.0f64);
        let mut calls = 0;
        for path in &paths {
            let trace = Trace::read(path)?;
            let (mut sum, mut max) = (0.0, 0.0f64);
            let calls_before = calls;
            for &f in &factors {
                let t = scaled(&trace, f);
                let mut r = Replayer::with_config(config.clone(), DEFAULT_REPLAY_CAPACITY)?;
                r.run(&t)?;
                let ratio = r.report().reserved_over_live;
                let first = r.sim().calls().memory_calls();
                r.run(&t)?;
                r.run(&t)?;
                calls += r.sim().calls().memory_calls() - first;
                sum += ratio;
                max = max.max(ratio);
            }
            let name = path.file_stem().unwrap().to_string_lossy();
            println!(
                "{mode} {name:28} mean {:.4} max {:.4} calls in replays 2-3 {}",
                sum / factors.len() as f64,
                max,
                calls - calls_before
            );
            all_sum += sum;
            all_n += factors.len();
            all_max = all_max.max(max);
        }
        println!(
            "{mode} ALL mean {:.4} max {:.4} calls in replays 2-3 {calls}",
            all_sum / all_n as f64,
            all_max
        );
    }
    Ok(())
}
