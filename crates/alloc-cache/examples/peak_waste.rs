//! Where the memory reserved above live memory sits at the peak of reserved bytes: replays a
//! trace and, at the allocation that set the peak, splits reserved bytes per pool into live
//! requested bytes, rounding (allocated minus requested), free bytes in whole pages lying inside
//! free blocks (which stitching could move) and free bytes sharing a page with a live block.
//!
//! `cargo run --release -p kiln-alloc-cache --example peak_waste -- TRACE [default|expandable|stitching]`

use kiln_alloc_cache::{
    AllocatorConfig, BlockSnapshotState, CachingAllocator, MemorySnapshot, PoolKind, SimBackend,
    StreamId, Trace, TraceEvent,
};
use std::collections::HashMap;
use std::sync::Arc;

const PAGE: u64 = 2 << 20;

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).ok_or("usage: peak_waste TRACE [mode]")?;
    let mut trace = Trace::read(path)?;
    if let Some(f) = args.get(3) {
        let f: f64 = f.parse()?;
        for e in &mut trace.events {
            if let TraceEvent::Alloc { bytes, .. } = e {
                *bytes = (*bytes as f64 * f) as usize;
            }
        }
    }
    let config = match args.get(2).map(String::as_str) {
        None | Some("default") => AllocatorConfig::default(),
        Some("expandable") => AllocatorConfig::expandable(),
        Some("stitching") => AllocatorConfig {
            page_stitching: true,
            ..AllocatorConfig::expandable()
        },
        Some(other) => return Err(format!("mode `{other}`").into()),
    };
    let sim = Arc::new(SimBackend::new(80 << 30).with_page_granularity(PAGE as usize));
    let a = CachingAllocator::new(Arc::clone(&sim), config)?;
    let mut live = HashMap::new();
    let (mut live_bytes, mut peak_live) = (0usize, 0usize);
    let mut peak: Option<(i64, usize, usize, MemorySnapshot)> = None;
    let mut live_peak: Option<MemorySnapshot> = None;
    for (i, event) in trace.events.iter().enumerate() {
        match *event {
            TraceEvent::Alloc { id, bytes } => {
                let raw = a.allocate_raw(bytes, StreamId::DEFAULT)?;
                live_bytes += bytes;
                if live_bytes > peak_live {
                    live_peak = Some(a.snapshot());
                }
                peak_live = peak_live.max(live_bytes);
                let reserved = a.memory_stats().reserved_bytes.all.current;
                if peak.as_ref().is_none_or(|p| reserved > p.0) {
                    peak = Some((reserved, live_bytes, i, a.snapshot()));
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
    let (reserved, live_then, at, snap) = peak.ok_or("empty trace")?;
    println!(
        "peak reserved {:.2} MiB at event {at} (live then {:.2}); peak live {:.2}; ratio {:.4}; \
         excess over peak live {:.2} MiB",
        mib(reserved as u64),
        mib(live_then as u64),
        mib(peak_live as u64),
        reserved as f64 / peak_live as f64,
        mib(reserved as u64 - peak_live as u64)
    );
    if let Some(snap) = &live_peak {
        // Pages holding a live byte at the peak of live bytes: what perfect stitching keeps.
        let mut pages = 0u64;
        for s in &snap.segments {
            let mut touched = std::collections::BTreeSet::new();
            for b in s
                .blocks
                .iter()
                .filter(|b| b.state != BlockSnapshotState::Inactive)
            {
                let (lo, hi) = (b.address - s.address, b.address - s.address + b.size as u64);
                touched.extend(lo / PAGE..hi.div_ceil(PAGE));
            }
            pages += touched.len() as u64;
        }
        println!(
            "at peak live: reserved {:.2}, pages touched by live blocks {:.2} MiB (ratio {:.4})",
            mib(snap.stats.reserved_bytes.all.current as u64),
            mib(pages * PAGE),
            (pages * PAGE) as f64 / peak_live as f64
        );
    }
    for pool in [PoolKind::Small, PoolKind::Large] {
        let (mut mapped, mut req, mut alloc, mut whole, mut partial, mut segs) = (0, 0, 0, 0, 0, 0);
        let mut free_sizes = Vec::new();
        for s in snap.segments.iter().filter(|s| s.segment_type == pool) {
            segs += 1;
            mapped += s.total_size as u64;
            req += s.requested_size as u64;
            alloc += s.allocated_size as u64;
            for b in &s.blocks {
                if b.state != BlockSnapshotState::Inactive || !b.fully_mapped {
                    continue;
                }
                let (lo, hi) = (b.address, b.address + b.size as u64);
                let (p0, p1) = ((lo - s.address).div_ceil(PAGE), (hi - s.address) / PAGE);
                let inner = if s.is_expandable && p1 > p0 {
                    (p1 - p0) * PAGE
                } else if !s.is_expandable && s.blocks.len() == 1 {
                    b.size as u64
                } else {
                    0
                };
                whole += inner;
                partial += b.size as u64 - inner;
                free_sizes.push(b.size as u64);
            }
        }
        free_sizes.sort_unstable_by(|x, y| y.cmp(x));
        let top: Vec<String> = free_sizes
            .iter()
            .take(12)
            .map(|&s| format!("{:.2}", mib(s)))
            .collect();
        println!(
            "{pool:?}: {segs} segments, mapped {:.2}, requested {:.2}, rounding {:.2}, free in whole \
             pages/segments {:.2}, free sharing pages {:.2}; largest free: {}",
            mib(mapped),
            mib(req),
            mib(alloc - req),
            mib(whole),
            mib(partial),
            top.join(" ")
        );
    }
    Ok(())
}
