//! Peak reserved over peak live of every shipped trace, kiln's allocator and the model of
//! PyTorch's, in both modes, as a Markdown table (the figures `cargo xtask bench alloc` reports,
//! without the rest of the bench).
//!
//! `cargo run --release -p kiln-alloc-cache --example ratio_table [TRACE...]`
//!
//! Columns: kiln default and expandable; expandable with `page_stitching` (stitched blocks:
//! the simulated device aliases pages), on CUDA's 2 MiB pages and on the host backend's
//! 64 KiB ones; default with `planned_steps` (steps marked at the
//! trace's `# step` lines, or each replay of a trace without them, replayed three times), with
//! the steps served by the plan out of all steps; PyTorch's policy in both modes; and the
//! backend calls kiln's default mode makes in replays 2 to 10 of the whole trace back to back
//! (0 when the cache shaped by the first replay serves every later one).

mod common;

use kiln_alloc_cache::planned::steps_of;
use kiln_alloc_cache::replay::DEFAULT_REPLAY_CAPACITY;
use kiln_alloc_cache::{
    replay_stitched, replay_with, AllocatorConfig, ReplayMode, ReplayPolicy, Replayer, Trace,
    DEFAULT_HOST_PAGE,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut paths: Vec<String> = std::env::args().skip(1).collect();
    if paths.is_empty() {
        for path in common::shipped_traces()? {
            paths.push(path.display().to_string());
        }
    }
    println!(
        "| trace | kiln default | kiln expandable | + stitching | + stitching, host pages | \
         planned (steps planned) | PyTorch default | PyTorch expandable | \
         kiln default calls in replays 2-10 |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for path in paths {
        let text = std::fs::read_to_string(&path)?;
        let trace = Trace::parse(&text)?;
        let name = std::path::Path::new(&path)
            .file_stem()
            .map_or(path.clone(), |s| s.to_string_lossy().into_owned());
        let ratio = |policy, mode| {
            replay_with(&trace, policy, mode, DEFAULT_REPLAY_CAPACITY)
                .map(|r| format!("{:.3}", r.reserved_over_live))
        };
        let mut cells = vec![
            ratio(ReplayPolicy::Kiln, ReplayMode::Default)?,
            ratio(ReplayPolicy::Kiln, ReplayMode::Expandable)?,
            format!(
                "{:.3}",
                replay_stitched(&trace, DEFAULT_REPLAY_CAPACITY)?.reserved_over_live
            ),
        ];
        let stitching = AllocatorConfig {
            page_stitching: true,
            ..AllocatorConfig::expandable()
        };
        let mut host = Replayer::with_page(stitching, DEFAULT_REPLAY_CAPACITY, DEFAULT_HOST_PAGE)?;
        host.run(&trace)?;
        cells.push(format!("{:.3}", host.report().reserved_over_live));
        let config = AllocatorConfig {
            planned_steps: true,
            ..AllocatorConfig::default()
        };
        let mut planned = Replayer::with_config(config, DEFAULT_REPLAY_CAPACITY)?;
        let steps = steps_of(&text)?;
        // A trace without step lines is one step; replay it three times to plan it.
        let runs = if steps.len() == 1 { 3 } else { 1 };
        for _ in 0..runs {
            planned.run_steps(&text)?;
        }
        planned.allocator().mark_step()?;
        let served = planned.allocator().plan_counts().0.planned_steps;
        let total = if steps.len() == 1 { 3 } else { steps.len() - 1 };
        cells.push(format!(
            "{:.3} ({served}/{total})",
            planned.report().reserved_over_live
        ));
        cells.push(ratio(ReplayPolicy::PyTorch, ReplayMode::Default)?);
        cells.push(ratio(ReplayPolicy::PyTorch, ReplayMode::Expandable)?);
        let mut r = Replayer::new(ReplayMode::Default, DEFAULT_REPLAY_CAPACITY)?;
        r.run(&trace)?;
        let first = r.sim().calls().memory_calls();
        for _ in 1..10 {
            r.run(&trace)?;
        }
        cells.push(format!("{}", r.sim().calls().memory_calls() - first));
        println!("| {name} | {} |", cells.join(" | "));
    }
    Ok(())
}
