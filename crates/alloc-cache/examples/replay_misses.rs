//! Where does a trace's fragmentation come from? Replays a trace (once, or `STEPS` times back
//! to back) and prints every allocation that reached the backend, with reserved, live and
//! cached-free bytes at that moment, then the segment map at the peak of reserved bytes.
//!
//! `cargo run --release -p kiln-alloc-cache --example replay_misses -- TRACE [default|expandable] [STEPS]`
//!
//! This is the diagnostic behind the design note at the top of `allocator.rs`.

use kiln_alloc_cache::{
    AllocatorConfig, BlockSnapshotState, CachingAllocator, MemorySnapshot, PoolKind, SimBackend,
    StreamId, Trace, TraceEvent,
};
use std::collections::HashMap;
use std::sync::Arc;

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        return Err("usage: replay_misses TRACE [default|expandable] [STEPS]".into());
    };
    let trace = Trace::read(std::path::Path::new(path))?;
    let config = match args.get(2).map(String::as_str) {
        None | Some("default") => AllocatorConfig::default(),
        Some("expandable") => AllocatorConfig::expandable(),
        Some(other) => return Err(format!("mode `{other}`: use default or expandable").into()),
    };
    let steps: usize = args.get(3).map_or(Ok(1), |s| s.parse())?;
    let sim = Arc::new(SimBackend::new(80 << 30).with_page_granularity(2 << 20));
    let a = CachingAllocator::new(Arc::clone(&sim), config)?;
    let mut live = HashMap::new();
    let (mut live_bytes, mut peak_live) = (0usize, 0usize);
    let mut peak: Option<(usize, usize, MemorySnapshot)> = None;
    for step in 0..steps {
        println!("--- step {}", step + 1);
        for (i, event) in trace.events.iter().enumerate() {
            match *event {
                TraceEvent::Alloc { id, bytes } => {
                    let before = a.memory_stats();
                    let raw = a.allocate_raw(bytes, StreamId::DEFAULT)?;
                    let after = a.memory_stats();
                    live_bytes += bytes;
                    peak_live = peak_live.max(live_bytes);
                    let reserved = after.reserved_bytes.all.current as usize;
                    if after.num_device_alloc != before.num_device_alloc {
                        let cached_free =
                            before.reserved_bytes.all.current - before.allocated_bytes.all.current;
                        println!(
                            "event {i:6}: {:9.3} MiB missed ({} segments released) -> reserved \
                             {:9.1} MiB, live {:9.1} MiB, cached free before {:8.1} MiB",
                            mib(bytes),
                            after.num_device_free - before.num_device_free,
                            mib(reserved),
                            mib(live_bytes),
                            mib(cached_free as usize),
                        );
                    }
                    if peak.as_ref().is_none_or(|(r, _, _)| reserved > *r) {
                        peak = Some((reserved, live_bytes, a.snapshot()));
                    }
                    live.insert(id, raw);
                }
                TraceEvent::Free { id } => {
                    let raw = live.remove(&id).ok_or("free of an unknown id")?;
                    live_bytes -= raw.size();
                    a.free_raw(raw)?;
                }
            }
        }
    }
    let Some((reserved, live_then, snapshot)) = peak else {
        return Ok(());
    };
    println!(
        "peak reserved {:.1} MiB (live then {:.1} MiB); peak live {:.1} MiB; reserved/live {:.4}",
        mib(reserved),
        mib(live_then),
        mib(peak_live),
        reserved as f64 / peak_live.max(1) as f64
    );
    println!("large segments at that peak (requested MiB; _free MiB):");
    for s in snapshot
        .segments
        .iter()
        .filter(|s| s.segment_type == PoolKind::Large)
    {
        let blocks: Vec<String> = s
            .blocks
            .iter()
            .map(|b| match b.state {
                BlockSnapshotState::Inactive => format!("_{:.2}", mib(b.size)),
                _ => format!("{:.2}", mib(b.requested_size)),
            })
            .collect();
        println!("  {:8.2} MiB: {}", mib(s.total_size), blocks.join(" "));
    }
    let small = snapshot
        .segments
        .iter()
        .filter(|s| s.segment_type == PoolKind::Small);
    let (count, free): (usize, usize) = small.fold((0, 0), |(n, f), s| {
        (n + 1, f + s.total_size - s.active_size)
    });
    println!("small segments: {count}, {:.2} MiB of them free", mib(free));
    Ok(())
}
