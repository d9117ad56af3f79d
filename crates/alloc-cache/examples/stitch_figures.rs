//! Page stitching on trace files: for each, expandable segments without and with
//! `page_stitching`, one replay and ten back to back on a fresh simulated 80 GiB device.
//!
//! `cargo run -p kiln-alloc-cache --example stitch_figures -- crates/alloc-cache/traces/*.trace`
//!
//! Columns: peak reserved / peak live after one replay and after ten, backend memory calls
//! (reserve, map, unmap, remap, ...) in the first replay and in the nine after it.

use kiln_alloc_cache::{replay, AllocatorConfig, Replayer, Trace};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("trace | stitching | reserved/live x1 | x10 | calls step 1 | calls steps 2-10");
    for path in std::env::args().skip(1) {
        let trace = Trace::read(&path)?;
        let name = path.rsplit('/').next().unwrap_or(&path);
        for page_stitching in [false, true] {
            let config = AllocatorConfig {
                page_stitching,
                ..AllocatorConfig::expandable()
            };
            let mut r = Replayer::with_config(config, replay::DEFAULT_REPLAY_CAPACITY)?;
            r.run(&trace)?;
            let once = r.report().reserved_over_live;
            let first = r.sim().calls().memory_calls();
            for _ in 1..10 {
                r.run(&trace)?;
            }
            r.allocator().check_invariants()?;
            let later = r.sim().calls().memory_calls() - first;
            let ten = r.report().reserved_over_live;
            println!("{name} | {page_stitching} | {once:.4} | {ten:.4} | {first} | {later}");
        }
    }
    Ok(())
}
