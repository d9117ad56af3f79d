//! Every figure a change of allocation policy must keep, for every shipped trace, in one table:
//! peak reserved / peak live, backend memory calls after step 1 (recorded traces: the events
//! after their `# step 2` line; synthetic ones, a single step each: replays 2-10 of the whole
//! trace), backend calls in replays 2-10 of the whole trace, and out-of-memory failures on a
//! device 5% larger than peak live (as `cargo xtask bench alloc` counts them). Every replay
//! marks the start of each step (`mark_step`), which only the planned modes use.
//!
//! `cargo run --release -p kiln-alloc-cache --example policy_check [TRACE...]`

mod common;

use kiln_alloc_cache::planned::steps_of;
use kiln_alloc_cache::replay::DEFAULT_REPLAY_CAPACITY;
use kiln_alloc_cache::{AllocatorConfig, Replayer, Trace};

/// (reserved/live, calls after step 1, calls in replays 2-10, OOMs at 1.05x).
fn measure(
    text: &str,
    config: &AllocatorConfig,
) -> Result<(f64, u64, u64, u64), Box<dyn std::error::Error>> {
    let mut r = Replayer::with_config(config.clone(), DEFAULT_REPLAY_CAPACITY)?;
    // Recorded traces: what comes before step 1, then one trace per step.
    let steps = steps_of(text)?;
    let mut after_step_1 = None;
    for (i, step) in steps.iter().enumerate() {
        if i == 2 {
            after_step_1 = Some(r.sim().calls().memory_calls());
        }
        r.allocator().mark_step()?;
        r.run(step)?;
    }
    let after_step_1 = after_step_1.map(|c| r.sim().calls().memory_calls() - c);
    let ratio = r.report().reserved_over_live;
    let first = r.sim().calls().memory_calls();
    for _ in 1..10 {
        r.run_steps(text)?;
    }
    let replays = r.sim().calls().memory_calls() - first;
    r.allocator().check_invariants()?;
    let live = Trace::parse(text)?.peak_live_bytes();
    let capacity = ((live as f64 * 1.05) as usize).div_ceil(2 << 20) * (2 << 20);
    let mut tight = Replayer::with_config(config.clone(), capacity)?;
    tight.run_steps(text)?;
    Ok((
        ratio,
        after_step_1.unwrap_or(replays),
        replays,
        tight.report().ooms,
    ))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut paths: Vec<String> = std::env::args().skip(1).collect();
    if paths.is_empty() {
        for path in common::shipped_traces()? {
            paths.push(path.display().to_string());
        }
    }
    let stitching = AllocatorConfig {
        page_stitching: true,
        ..AllocatorConfig::expandable()
    };
    let modes = [
        ("default", AllocatorConfig::default()),
        ("expandable", AllocatorConfig::expandable()),
        ("stitching", stitching.clone()),
        (
            "planned",
            AllocatorConfig {
                planned_steps: true,
                ..AllocatorConfig::default()
            },
        ),
        (
            "planned stitching",
            AllocatorConfig {
                planned_steps: true,
                ..stitching
            },
        ),
    ];
    println!(
        "| trace | mode | reserved/live | calls after step 1 | calls in replays 2-10 | OOMs at 1.05x |"
    );
    println!("|---|---|---:|---:|---:|---:|");
    for path in paths {
        let text = std::fs::read_to_string(&path)?;
        let name = path
            .rsplit('/')
            .next()
            .unwrap_or(&path)
            .trim_end_matches(".trace");
        for (mode, config) in &modes {
            let (ratio, after, replays, ooms) = measure(&text, config)?;
            println!("| {name} | {mode} | {ratio:.4} | {after} | {replays} | {ooms} |");
        }
    }
    Ok(())
}
