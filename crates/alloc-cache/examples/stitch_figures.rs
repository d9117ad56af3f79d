//! Page stitching on trace files: for each, expandable segments without and with
//! `page_stitching` on a fresh simulated 80 GiB device.
//!
//! `cargo run -p kiln-alloc-cache --example stitch_figures -- crates/alloc-cache/traces/*.trace`
//!
//! A trace with `# step N` comments (a recorded run) is replayed once and split at `# step 2`;
//! one without (a single step that frees everything) is replayed ten times back to back, each
//! replay counting as a step. Columns: peak reserved / peak live, backend memory calls
//! (reserve, map, unmap, remap, alias, ...) in step 1 and in all later steps.

use kiln_alloc_cache::{AllocatorConfig, Replayer, Trace, TraceEvent};

/// Events before the `# step 2` line, when the text has one.
fn first_step_events(text: &str) -> Option<usize> {
    let mut events = 0;
    for line in text.lines().map(str::trim) {
        if line.starts_with("# step 2") {
            return Some(events);
        }
        if line.starts_with("a ") || line.starts_with("f ") {
            events += 1;
        }
    }
    None
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("trace | stitching | reserved/live | calls step 1 | calls after step 1");
    for path in std::env::args().skip(1) {
        let text = std::fs::read_to_string(&path)?;
        let trace = Trace::parse(&text)?;
        let name = path.rsplit('/').next().unwrap_or(&path);
        let split = first_step_events(&text);
        for page_stitching in [false, true] {
            let config = AllocatorConfig {
                page_stitching,
                ..AllocatorConfig::expandable()
            };
            let mut r =
                Replayer::with_config(config, kiln_alloc_cache::replay::DEFAULT_REPLAY_CAPACITY)?;
            let (first, later) = match split {
                Some(n) => {
                    let part = |e: &[TraceEvent]| Trace { events: e.to_vec() };
                    r.run(&part(&trace.events[..n]))?;
                    let first = r.sim().calls().memory_calls();
                    r.run(&part(&trace.events[n..]))?;
                    (first, r.sim().calls().memory_calls() - first)
                }
                None => {
                    r.run(&trace)?;
                    let first = r.sim().calls().memory_calls();
                    for _ in 1..10 {
                        r.run(&trace)?;
                    }
                    (first, r.sim().calls().memory_calls() - first)
                }
            };
            r.allocator().check_invariants()?;
            let ratio = r.report().reserved_over_live;
            println!("{name} | {page_stitching} | {ratio:.4} | {first} | {later}");
        }
    }
    Ok(())
}
