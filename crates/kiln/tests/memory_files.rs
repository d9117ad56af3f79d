//! Every train run folder holds `memory.svg` (one step stacked by category, the per-epoch
//! curves); with `memory_history` it also holds `memory_snapshot.pickle` in the layout of
//! `torch.cuda.memory._snapshot()`, whose events read back with the totals kiln recorded.
//!
//! One test in its own binary: the CPU allocator's history is process-wide, so no other run
//! may record at the same time.

mod common;

use kiln::alloc::pickle::from_pickle;
use kiln::alloc::snapshot_read::read_snapshot_file;
use kiln::alloc::{MemoryCategory, MemoryEventKind};
use kiln::device::Device;
use kiln::recipe::memory::{MEMORY_SNAPSHOT, MEMORY_SVG};
use kiln::recipe::{train, Quiet};

fn run_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-memory-files-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn run_folders_hold_the_memory_picture_and_with_history_the_snapshot() {
    // 48 training images in batches of 16: 3 batches per epoch; epoch 1 is frozen, so the
    // second batch of epoch 2 is pictured.
    let plain = run_dir("plain");
    let config = common::tiny_config(plain.clone(), 3, (48, 16));
    let outcome = train(&config, &mut Quiet).unwrap();
    let svg = std::fs::read_to_string(plain.join(MEMORY_SVG)).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<svg").count(), 1);
    assert!(
        svg.contains("one training step (epoch 2, batch 2): allocated bytes by category"),
        "the step panel is drawn: {svg}"
    );
    assert!(
        svg.matches("<polygon").count() >= 1,
        "at least one category layer"
    );
    assert!(svg.contains(">peak ") && svg.contains("largest blocks at the peak"));
    assert!(svg.contains("memory per epoch"));
    for series in [">allocated<", ">reserved<", ">peak<"] {
        assert!(svg.contains(series), "epoch series {series}");
    }
    // Three epoch curves and the step's dashed reserved line.
    assert_eq!(svg.matches("<polyline").count(), 4);
    assert_eq!(outcome.history.len(), 2);
    assert!(
        !plain.join(MEMORY_SNAPSHOT).exists(),
        "no snapshot without memory_history"
    );

    let recorded = run_dir("history");
    let config = kiln::recipe::TrainConfig {
        memory_history: Some(1 << 20),
        ..common::tiny_config(recorded.clone(), 3, (48, 16))
    };
    train(&config, &mut Quiet).unwrap();
    let alloc = kiln::device::allocator(Device::Cpu).unwrap();
    let live = alloc.memory_history();
    alloc.record_memory_history(false, 0).unwrap();
    assert!(recorded.join(MEMORY_SVG).exists());
    let path = recorded.join(MEMORY_SNAPSHOT);
    // PyTorch's layout, key for key.
    let raw = from_pickle(&std::fs::read(&path).unwrap()).unwrap();
    let traces = raw.get("device_traces").unwrap().as_list().unwrap();
    assert_eq!(traces.len(), 1, "the CPU is device index 0");
    let first = &traces[0].as_list().unwrap()[0];
    let keys: Vec<_> = match first {
        kiln::alloc::pickle::PickleValue::Dict(items) => {
            items.iter().map(|(k, _)| k.as_str().unwrap()).collect()
        }
        other => panic!("a trace entry is a dict, not {other}"),
    };
    assert_eq!(
        keys,
        ["action", "addr", "size", "stream", "time_us", "frames", "category"]
    );
    let seg = &raw.get("segments").unwrap().as_list().unwrap()[0];
    for key in [
        "device",
        "address",
        "total_size",
        "stream",
        "segment_type",
        "blocks",
    ] {
        assert!(seg.get(key).is_some(), "segment key {key}");
    }
    // Read back: the events are the recorder's, with the allocated / reserved totals it kept.
    let loaded = read_snapshot_file(&path).unwrap();
    let events = &loaded.device_traces[0];
    assert_eq!(live.dropped, 0);
    assert!(events.len() > 100, "{} events", events.len());
    assert!(events.len() <= live.events.len());
    for (i, (got, want)) in events.iter().zip(&live.events).enumerate() {
        assert_eq!(
            (
                got.kind,
                got.address,
                got.size,
                got.allocated_after,
                got.reserved_after
            ),
            (
                want.kind,
                want.address,
                want.size,
                want.allocated_after,
                want.reserved_after
            ),
            "event {i}"
        );
    }
    assert!(events.iter().any(|e| e.kind == MemoryEventKind::Alloc));
    assert!(events
        .iter()
        .any(|e| e.kind == MemoryEventKind::FreeRequested));
    for s in &loaded.segments {
        assert_eq!(s.blocks.iter().map(|b| b.size).sum::<usize>(), s.total_size);
    }
    // Attribution reaches the CPU pool's threads: the kernels' scratch (conv2d's im2col columns
    // above all) carries the op that asked for it, so what nobody declared (kiln-losses' forward
    // values, documented in kiln-alloc-cache's history.rs) is a sliver of the bytes.
    let (unknown, total) = live
        .events
        .iter()
        .filter(|e| e.kind == MemoryEventKind::Alloc)
        .fold((0usize, 0usize), |(u, t), e| {
            let cat = e.attribution.category.unwrap_or(MemoryCategory::Unknown);
            let unknown = if cat == MemoryCategory::Unknown {
                e.size
            } else {
                0
            };
            (u + unknown, t + e.size)
        });
    assert!(
        unknown * 50 < total,
        "{unknown} of {total} allocated bytes have no category"
    );
    std::fs::remove_dir_all(&plain).unwrap();
    std::fs::remove_dir_all(&recorded).unwrap();
}
