//! Peak reserved over peak live of every shipped trace, kiln's allocator and the model of
//! PyTorch's, in both modes, as a Markdown table (the figures `cargo xtask bench alloc` reports,
//! without the rest of the bench).
//!
//! `cargo run --release -p kiln-alloc-cache --example ratio_table [TRACE...]`
//!
//! The last column: backend calls kiln's default mode makes in replays 2 to 10 of the whole
//! trace back to back (0 when the cache shaped by the first replay serves every later one).

use kiln_alloc_cache::replay::DEFAULT_REPLAY_CAPACITY;
use kiln_alloc_cache::{replay_with, ReplayMode, ReplayPolicy, Replayer, Trace};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut paths: Vec<String> = std::env::args().skip(1).collect();
    if paths.is_empty() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/traces");
        for e in std::fs::read_dir(dir)? {
            paths.push(e?.path().display().to_string());
        }
        paths.sort();
    }
    println!(
        "| trace | kiln default | kiln expandable | PyTorch default | PyTorch expandable | \
         kiln default calls in replays 2-10 |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for path in paths {
        let trace = Trace::read(&path)?;
        let name = std::path::Path::new(&path)
            .file_stem()
            .map_or(path.clone(), |s| s.to_string_lossy().into_owned());
        let mut cells = Vec::new();
        for policy in [ReplayPolicy::Kiln, ReplayPolicy::PyTorch] {
            for mode in [ReplayMode::Default, ReplayMode::Expandable] {
                let r = replay_with(&trace, policy, mode, DEFAULT_REPLAY_CAPACITY)?;
                cells.push(format!("{:.3}", r.reserved_over_live));
            }
        }
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
