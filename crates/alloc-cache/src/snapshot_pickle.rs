//! The snapshot PyTorch's memory_viz opens: a [`MemorySnapshot`] and the recorded
//! [`MemoryEvent`]s in the layout of `torch.cuda.memory._snapshot()`, pickled as
//! `torch.cuda.memory._dump_snapshot` writes it.
//!
//! Layout (the keys PyTorch's C++ snapshot, `torch/cuda/_memory_viz.py` and `MemoryViz.js` read):
//! - top level: `{"segments": [...], "device_traces": [[...], ...]}`, one trace list per device
//!   index up to this device's (the others empty);
//! - segment: `device`, `address`, `total_size`, `allocated_size`, `active_size`,
//!   `requested_size`, `stream`, `segment_type` (`small` / `large`), `segment_pool_id` (`(0, 0)`),
//!   `is_expandable`, `frames` (`[]`), `blocks`;
//! - block: `address`, `size`, `requested_size`, `state` (`active_allocated`,
//!   `active_pending_free`, `inactive`: the names the C++ side writes and `MemoryViz.js` tests),
//!   `frames`;
//! - trace entry: `action`, `addr`, `size`, `stream`, `time_us`, `frames`, and `category`
//!   (`MemoryViz.js` colours the timeline by it, as it does for snapshots made from the
//!   profiler); `oom` entries add `device_free`.
//!
//! Invariants:
//! - A frame is `{"filename": module path, "line": 0, "name": op}`: memory_viz shows it as the
//!   allocation's stack (`layer3.1.conv2:0:ConvolutionBackward`). Memory nobody attributed gets
//!   `<no module>` / `<no op>`, never an empty stack (which memory_viz reads as "allocated
//!   before recording").
//! - A live block's frames are those of the last `alloc` event at its address; blocks allocated
//!   before recording have none.
//! - An expandable segment is written as one segment per run of fully mapped blocks (PyTorch's
//!   own layout, where `total_size` is the sum of the blocks); its map / unmap events are named
//!   `segment_map` / `segment_unmap`. Events of a segment that no longer exists at dump time
//!   are named `segment_alloc` / `segment_free`.
//! - A non-empty trace ends with a `snapshot` entry (as PyTorch records when a snapshot is
//!   taken while recording) with category `unknown`; `MemoryViz.js` needs that category to be
//!   among the ones it saw.
//! - kiln does not record the driver's free bytes at an OOM: `device_free` is 0.

use crate::history::{Attribution, MemoryCategory, MemoryEvent, MemoryEventKind};
use crate::pickle::{to_pickle, PickleError, PickleValue};
use crate::snapshot::{BlockSnapshotState, MemorySnapshot, SegmentSnapshot};
use crate::snapshot_read::SnapshotFileError;
use crate::stats::PoolKind;
use std::collections::HashMap;
use std::path::Path;

/// `category` strings of the trace entries, in [`MemoryCategory`] order.
pub fn category_name(category: MemoryCategory) -> &'static str {
    match category {
        MemoryCategory::Parameter => "parameter",
        MemoryCategory::Gradient => "gradient",
        MemoryCategory::OptimizerState => "optimizer_state",
        MemoryCategory::Activation => "activation",
        MemoryCategory::Temporary => "temporary",
        MemoryCategory::Data => "data",
        MemoryCategory::Unknown => "unknown",
    }
}

/// Every category, in stack order (bottom first).
pub const CATEGORIES: [MemoryCategory; 7] = [
    MemoryCategory::Parameter,
    MemoryCategory::Gradient,
    MemoryCategory::OptimizerState,
    MemoryCategory::Data,
    MemoryCategory::Activation,
    MemoryCategory::Temporary,
    MemoryCategory::Unknown,
];

/// The category a `category` string names (`unknown` for any other string).
pub fn category_from_name(name: &str) -> MemoryCategory {
    CATEGORIES
        .into_iter()
        .find(|&c| category_name(c) == name)
        .unwrap_or(MemoryCategory::Unknown)
}

/// Module shown for memory no scope attributed.
pub const NO_MODULE: &str = "<no module>";
/// Op shown for memory no scope attributed.
pub const NO_OP: &str = "<no op>";

/// PyTorch's `action` name of an event kind; `expandable` picks the map / unmap names.
pub fn action_name(kind: MemoryEventKind, expandable: bool) -> &'static str {
    match (kind, expandable) {
        (MemoryEventKind::Alloc, _) => "alloc",
        (MemoryEventKind::FreeRequested, _) => "free_requested",
        (MemoryEventKind::FreeCompleted, _) => "free_completed",
        (MemoryEventKind::SegmentAlloc, false) => "segment_alloc",
        (MemoryEventKind::SegmentAlloc, true) => "segment_map",
        (MemoryEventKind::SegmentFree, false) => "segment_free",
        (MemoryEventKind::SegmentFree, true) => "segment_unmap",
        (MemoryEventKind::Oom, _) => "oom",
    }
}

fn int(v: impl TryInto<i128>) -> PickleValue {
    // Every integer kiln writes (usize, u64) fits in 128 bits.
    PickleValue::Int(v.try_into().unwrap_or(i128::MAX))
}

fn frames(attribution: &Attribution) -> PickleValue {
    let module = attribution.module.as_deref().unwrap_or(NO_MODULE);
    let op = attribution.op.as_deref().unwrap_or(NO_OP);
    PickleValue::List(vec![PickleValue::dict([
        ("filename", PickleValue::str(module)),
        ("line", int(0)),
        ("name", PickleValue::str(op)),
    ])])
}

fn state_name(state: BlockSnapshotState) -> &'static str {
    match state {
        BlockSnapshotState::ActiveAllocated => "active_allocated",
        BlockSnapshotState::ActivePendingFree => "active_pending_free",
        BlockSnapshotState::Inactive => "inactive",
    }
}

/// The snapshot dict (before pickling) of `device_index`'s allocator state `snapshot` and its
/// recorded `events` (oldest first).
pub fn snapshot_value(
    device_index: usize,
    snapshot: &MemorySnapshot,
    events: &[MemoryEvent],
) -> PickleValue {
    // Who allocated each block still live at the end of the history.
    let mut live: HashMap<u64, &Attribution> = HashMap::new();
    for e in events {
        match e.kind {
            MemoryEventKind::Alloc => {
                live.insert(e.address, &e.attribution);
            }
            MemoryEventKind::FreeCompleted => {
                live.remove(&e.address);
            }
            _ => {}
        }
    }
    let mut segments = Vec::new();
    for seg in &snapshot.segments {
        for run in segment_runs(seg) {
            segments.push(segment_value(device_index, seg, run, &live));
        }
    }
    let expandable = |address: u64| {
        snapshot.segments.iter().any(|s| {
            s.is_expandable
                && address >= s.address
                && address - s.address < s.address_space.max(s.total_size) as u64
        })
    };
    let mut trace: Vec<PickleValue> = events
        .iter()
        .map(|e| {
            let segment_event = matches!(
                e.kind,
                MemoryEventKind::SegmentAlloc | MemoryEventKind::SegmentFree
            );
            let category = e.attribution.category.unwrap_or(MemoryCategory::Unknown);
            let mut items = vec![
                (
                    "action",
                    PickleValue::str(action_name(e.kind, segment_event && expandable(e.address))),
                ),
                ("addr", int(e.address)),
                ("size", int(e.size)),
                ("stream", int(e.stream.0)),
                ("time_us", int(e.time_us)),
                ("frames", frames(&e.attribution)),
                ("category", PickleValue::str(category_name(category))),
            ];
            if e.kind == MemoryEventKind::Oom {
                items.push(("device_free", int(0)));
            }
            PickleValue::dict(items)
        })
        .collect();
    if let Some(last) = events.last() {
        trace.push(PickleValue::dict([
            ("action", PickleValue::str("snapshot")),
            ("addr", int(0)),
            ("size", int(live_bytes(snapshot))),
            ("stream", int(0)),
            ("time_us", int(last.time_us)),
            ("frames", PickleValue::List(Vec::new())),
            ("category", PickleValue::str("unknown")),
        ]));
    }
    let mut device_traces = vec![PickleValue::List(Vec::new()); device_index];
    device_traces.push(PickleValue::List(trace));
    PickleValue::dict([
        ("segments", PickleValue::List(segments)),
        ("device_traces", PickleValue::List(device_traces)),
    ])
}

/// Bytes in blocks that are not free (allocated or pending), as the events count them.
fn live_bytes(snapshot: &MemorySnapshot) -> usize {
    snapshot
        .segments
        .iter()
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state != BlockSnapshotState::Inactive)
        .map(|b| b.size)
        .sum()
}

/// The blocks of `seg` PyTorch would write as one segment each: the whole segment when fixed,
/// each run of fully mapped blocks when expandable.
fn segment_runs(seg: &SegmentSnapshot) -> Vec<std::ops::Range<usize>> {
    if !seg.is_expandable {
        return std::iter::once(0..seg.blocks.len()).collect();
    }
    let mut runs = Vec::new();
    let mut start = None;
    for (i, b) in seg.blocks.iter().enumerate() {
        match (b.fully_mapped, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                runs.push(s..i);
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        runs.push(s..seg.blocks.len());
    }
    runs
}

fn segment_value(
    device_index: usize,
    seg: &SegmentSnapshot,
    run: std::ops::Range<usize>,
    live: &HashMap<u64, &Attribution>,
) -> PickleValue {
    let blocks = &seg.blocks[run];
    let (mut total, mut allocated, mut active, mut requested) = (0usize, 0usize, 0usize, 0usize);
    let block_values = blocks
        .iter()
        .map(|b| {
            total += b.size;
            if b.state == BlockSnapshotState::ActiveAllocated {
                allocated += b.size;
                requested += b.requested_size;
            }
            if b.state != BlockSnapshotState::Inactive {
                active += b.size;
            }
            let block_frames = match (b.state, live.get(&b.address)) {
                (BlockSnapshotState::Inactive, _) | (_, None) => PickleValue::List(Vec::new()),
                (_, Some(a)) => frames(a),
            };
            PickleValue::dict([
                ("address", int(b.address)),
                ("size", int(b.size)),
                ("requested_size", int(b.requested_size)),
                ("state", PickleValue::str(state_name(b.state))),
                ("frames", block_frames),
            ])
        })
        .collect();
    let address = blocks.first().map_or(seg.address, |b| b.address);
    let total = if seg.is_expandable {
        total
    } else {
        seg.total_size
    };
    PickleValue::dict([
        ("device", int(device_index)),
        ("address", int(address)),
        ("total_size", int(total)),
        ("allocated_size", int(allocated)),
        ("active_size", int(active)),
        ("requested_size", int(requested)),
        ("stream", int(seg.stream.0)),
        (
            "segment_type",
            PickleValue::str(match seg.segment_type {
                PoolKind::Small => "small",
                PoolKind::Large => "large",
            }),
        ),
        ("segment_pool_id", PickleValue::Tuple(vec![int(0), int(0)])),
        ("is_expandable", PickleValue::Bool(seg.is_expandable)),
        ("frames", PickleValue::List(Vec::new())),
        ("blocks", PickleValue::List(block_values)),
    ])
}

/// [`snapshot_value`] pickled.
pub fn snapshot_pickle(
    device_index: usize,
    snapshot: &MemorySnapshot,
    events: &[MemoryEvent],
) -> Result<Vec<u8>, PickleError> {
    to_pickle(&snapshot_value(device_index, snapshot, events))
}

/// Writes [`snapshot_pickle`] to `path` (what `torch.cuda.memory._dump_snapshot(path)` writes),
/// creating its folder.
pub fn write_snapshot_pickle(
    path: &Path,
    device_index: usize,
    snapshot: &MemorySnapshot,
    events: &[MemoryEvent],
) -> Result<(), SnapshotFileError> {
    let bytes = snapshot_pickle(device_index, snapshot, events)?;
    let io = |source| SnapshotFileError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    std::fs::write(path, bytes).map_err(io)
}
