//! The snapshot PyTorch's memory_viz opens: a [`MemorySnapshot`] and the recorded
//! [`MemoryEvent`](crate::MemoryEvent)s in the layout of `torch.cuda.memory._snapshot()`, pickled as
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
//! - A live block's frames are its recorded attribution; blocks allocated before recording have
//!   none.
//! - An expandable segment is written as one segment per run of fully mapped blocks (PyTorch's
//!   own layout, where `total_size` is the sum of the blocks); with expandable segments the
//!   segment events are page maps, named `segment_map` / `segment_unmap`.
//! - A block stops counting as allocated at its `free_requested` (kiln's `memory_allocated`);
//!   the final `snapshot` entry's size is the allocated bytes at the dump.
//! - A non-empty trace ends with a `snapshot` entry (as PyTorch records when a snapshot is
//!   taken while recording) with category `unknown`; `MemoryViz.js` needs that category to be
//!   among the ones it saw.
//! - kiln does not record the driver's free bytes at an OOM: `device_free` is 0.

use crate::history::{Attribution, MemoryCategory, MemoryEventKind};
use crate::pickle::{to_pickle, PickleError, PickleValue};
use crate::recorded::MemoryHistory;
use crate::snapshot::{BlockSnapshotState, MemorySnapshot, SegmentSnapshot};
use crate::stats::PoolKind;
use std::path::{Path, PathBuf};

/// What is wrong with a snapshot file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotFileError {
    /// Not a readable pickle.
    #[error("not a memory snapshot pickle: {0}")]
    Pickle(#[from] PickleError),
    /// A pickle, but not in the snapshot layout.
    #[error(
        "snapshot field {at}: {message} (expected the layout of torch.cuda.memory._snapshot())"
    )]
    Layout {
        /// Where (`segments[2].blocks[0].size`).
        at: String,
        /// What is wrong.
        message: String,
    },
    /// Reading or writing the file failed.
    #[error("snapshot file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// `category` string of the trace entries (PyTorch's lower-case names, as the profiler's).
pub fn category_name(category: MemoryCategory) -> &'static str {
    category.name()
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

/// The snapshot dict (before pickling) of `device_index`'s recorded `history`: its segments
/// now and its events (oldest first).
pub fn snapshot_value(device_index: usize, history: &MemoryHistory) -> PickleValue {
    let (snapshot, events) = (&history.snapshot, &history.events[..]);
    let mut segments = Vec::new();
    for seg in &snapshot.segments {
        for run in segment_runs(seg) {
            segments.push(segment_value(device_index, seg, run));
        }
    }
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
                    PickleValue::str(action_name(
                        e.kind,
                        segment_event && history.expandable_segments,
                    )),
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

/// Bytes in allocated blocks (kiln's `allocated`: a block stops counting at `free_requested`).
fn live_bytes(snapshot: &MemorySnapshot) -> usize {
    snapshot
        .segments
        .iter()
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state == BlockSnapshotState::ActiveAllocated)
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
            let block_frames = match (&b.attribution, b.state) {
                (
                    Some(a),
                    BlockSnapshotState::ActiveAllocated | BlockSnapshotState::ActivePendingFree,
                ) => frames(a),
                _ => PickleValue::List(Vec::new()),
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
    history: &MemoryHistory,
) -> Result<Vec<u8>, PickleError> {
    to_pickle(&snapshot_value(device_index, history))
}

/// Writes [`snapshot_pickle`] to `path` (what `torch.cuda.memory._dump_snapshot(path)` writes),
/// creating its folder.
pub fn write_snapshot_pickle(
    path: &Path,
    device_index: usize,
    history: &MemoryHistory,
) -> Result<(), SnapshotFileError> {
    let bytes = snapshot_pickle(device_index, history)?;
    let io = |source| SnapshotFileError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    std::fs::write(path, bytes).map_err(io)
}
