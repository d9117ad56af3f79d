//! Reading a memory_viz snapshot pickle back: kiln's own ([`snapshot_pickle`](crate::snapshot_pickle))
//! or one `torch.cuda.memory._dump_snapshot` wrote, into kiln's event type, for `cargo xtask
//! memviz` and the format tests.
//!
//! Invariants:
//! - Only the keys of the documented layout are read; missing optional ones (`device`,
//!   `frames`, `category`, `time_us`, `requested_size`) take PyTorch's defaults, a missing or
//!   mistyped required one is an error naming its place (`device_traces[0][12].size`).
//! - Actions kiln has no event for (`snapshot`, `annotate`, ...) are skipped.
//! - `allocated_after` / `reserved_after` are rebuilt from the events as kiln counts them (a
//!   block counts from `alloc` to `free_requested`): the bytes live at the end
//!   (`active_allocated` blocks; segment sizes) minus what the events added, so the first event
//!   starts from what was allocated before recording began. A file whose events do not add up
//!   clamps at 0 rather than wrapping.

use crate::backend::StreamId;
use crate::history::{Attribution, MemoryEvent, MemoryEventKind};
use crate::pickle::{from_pickle, PickleValue};
pub use crate::snapshot_pickle::SnapshotFileError;
use crate::snapshot_pickle::{category_from_name, NO_MODULE, NO_OP};
use std::path::Path;
use std::sync::Arc;

/// One block of a loaded segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedBlock {
    /// First byte.
    pub address: u64,
    /// Bytes.
    pub size: usize,
    /// Bytes asked for.
    pub requested_size: usize,
    /// `active_allocated`, `active_pending_free` or `inactive`.
    pub state: String,
    /// Module and op of the first frame (none when the block has no frames).
    pub attribution: Attribution,
}

/// One loaded segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedSegment {
    /// Device index.
    pub device: usize,
    /// First byte.
    pub address: u64,
    /// Bytes.
    pub total_size: usize,
    /// Stream.
    pub stream: StreamId,
    /// Whether expandable.
    pub is_expandable: bool,
    /// Blocks in address order.
    pub blocks: Vec<LoadedBlock>,
}

/// A snapshot file read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedSnapshot {
    /// Every segment of every device.
    pub segments: Vec<LoadedSegment>,
    /// The events of each device index, oldest first.
    pub device_traces: Vec<Vec<MemoryEvent>>,
}

impl LoadedSnapshot {
    /// The device index with the most events (0 when none has any).
    pub fn busiest_device(&self) -> usize {
        (0..self.device_traces.len())
            .max_by_key(|&d| (self.device_traces[d].len(), std::cmp::Reverse(d)))
            .unwrap_or(0)
    }
}

fn layout(at: &str, message: impl Into<String>) -> SnapshotFileError {
    SnapshotFileError::Layout {
        at: at.to_owned(),
        message: message.into(),
    }
}

fn field<'a>(
    v: &'a PickleValue,
    at: &str,
    key: &str,
) -> Result<&'a PickleValue, SnapshotFileError> {
    match v {
        PickleValue::Dict(_) => v
            .get(key)
            .ok_or_else(|| layout(&format!("{at}.{key}"), "missing")),
        other => Err(layout(
            at,
            format!("a {} where a dict belongs", other.type_name()),
        )),
    }
}

fn uint<T: TryFrom<i128>>(v: &PickleValue, at: &str) -> Result<T, SnapshotFileError> {
    let i = v
        .as_int()
        .ok_or_else(|| layout(at, format!("a {} where an int belongs", v.type_name())))?;
    T::try_from(i).map_err(|_| layout(at, format!("{i} is out of range")))
}

fn uint_field<T: TryFrom<i128>>(
    v: &PickleValue,
    at: &str,
    key: &str,
) -> Result<T, SnapshotFileError> {
    uint(field(v, at, key)?, &format!("{at}.{key}"))
}

fn list<'a>(v: &'a PickleValue, at: &str) -> Result<&'a [PickleValue], SnapshotFileError> {
    v.as_list()
        .ok_or_else(|| layout(at, format!("a {} where a list belongs", v.type_name())))
}

fn str_field<'a>(v: &'a PickleValue, at: &str, key: &str) -> Result<&'a str, SnapshotFileError> {
    let f = field(v, at, key)?;
    f.as_str().ok_or_else(|| {
        layout(
            &format!("{at}.{key}"),
            format!("a {} where a str belongs", f.type_name()),
        )
    })
}

/// Module and op from a `frames` list (the first frame: kiln writes one).
fn attribution(v: &PickleValue, at: &str) -> Result<Attribution, SnapshotFileError> {
    let mut out = Attribution::default();
    let Some(frames) = v.get("frames") else {
        return Ok(out);
    };
    let frames = list(frames, &format!("{at}.frames"))?;
    if let Some(first) = frames.first() {
        let fat = format!("{at}.frames[0]");
        let module = str_field(first, &fat, "filename")?;
        let op = str_field(first, &fat, "name")?;
        out.module = (module != NO_MODULE).then(|| Arc::from(module));
        out.op = (op != NO_OP).then(|| Arc::from(op));
    }
    if let Some(c) = v.get("category").and_then(PickleValue::as_str) {
        out.category = Some(category_from_name(c));
    }
    Ok(out)
}

fn kind(action: &str) -> Option<MemoryEventKind> {
    Some(match action {
        "alloc" => MemoryEventKind::Alloc,
        "free_requested" => MemoryEventKind::FreeRequested,
        "free_completed" => MemoryEventKind::FreeCompleted,
        "segment_alloc" | "segment_map" => MemoryEventKind::SegmentAlloc,
        "segment_free" | "segment_unmap" => MemoryEventKind::SegmentFree,
        "oom" => MemoryEventKind::Oom,
        _ => return None,
    })
}

/// Reads a snapshot from pickle bytes.
pub fn read_snapshot(bytes: &[u8]) -> Result<LoadedSnapshot, SnapshotFileError> {
    let top = from_pickle(bytes)?;
    let top = match top {
        // `_memory_viz` accepts a bare list of segments too.
        PickleValue::List(_) => PickleValue::dict([("segments", top)]),
        other => other,
    };
    let mut segments = Vec::new();
    for (i, seg) in list(field(&top, "snapshot", "segments")?, "segments")?
        .iter()
        .enumerate()
    {
        let at = format!("segments[{i}]");
        let device = match seg.get("device") {
            Some(d) => uint(d, &format!("{at}.device"))?,
            None => 0,
        };
        let mut blocks = Vec::new();
        let mut next = uint_field::<u64>(seg, &at, "address")?;
        for (j, b) in list(field(seg, &at, "blocks")?, &format!("{at}.blocks"))?
            .iter()
            .enumerate()
        {
            let bat = format!("{at}.blocks[{j}]");
            let size: usize = uint_field(b, &bat, "size")?;
            let address = match b.get("address") {
                Some(a) => uint(a, &format!("{bat}.address"))?,
                None => next,
            };
            next = address.saturating_add(size as u64);
            blocks.push(LoadedBlock {
                address,
                size,
                requested_size: match b.get("requested_size") {
                    Some(r) => uint(r, &format!("{bat}.requested_size"))?,
                    None => size,
                },
                state: str_field(b, &bat, "state")?.to_owned(),
                attribution: attribution(b, &bat)?,
            });
        }
        segments.push(LoadedSegment {
            device,
            address: uint_field(seg, &at, "address")?,
            total_size: uint_field(seg, &at, "total_size")?,
            stream: StreamId(uint_field(seg, &at, "stream")?),
            is_expandable: seg
                .get("is_expandable")
                .and_then(PickleValue::as_int)
                .is_some_and(|v| v != 0),
            blocks,
        });
    }
    let mut device_traces = Vec::new();
    if let Some(traces) = top.get("device_traces") {
        for (d, trace) in list(traces, "device_traces")?.iter().enumerate() {
            let dat = format!("device_traces[{d}]");
            let mut events = Vec::new();
            for (k, e) in list(trace, &dat)?.iter().enumerate() {
                let at = format!("{dat}[{k}]");
                let Some(kind) = kind(str_field(e, &at, "action")?) else {
                    continue;
                };
                let address = match e.get("addr") {
                    Some(a) => uint(a, &format!("{at}.addr"))?,
                    None => 0,
                };
                events.push(MemoryEvent {
                    kind,
                    address,
                    size: uint_field(e, &at, "size")?,
                    stream: StreamId(match e.get("stream") {
                        Some(s) => uint(s, &format!("{at}.stream"))?,
                        None => 0,
                    }),
                    time_us: match e.get("time_us") {
                        Some(t) => uint(t, &format!("{at}.time_us"))?,
                        None => 0,
                    },
                    attribution: attribution(e, &at)?,
                    allocated_after: 0,
                    reserved_after: 0,
                });
            }
            rebuild_totals(d, &segments, &mut events);
            device_traces.push(events);
        }
    }
    Ok(LoadedSnapshot {
        segments,
        device_traces,
    })
}

/// Fills `allocated_after` / `reserved_after` of device `device`'s events (module docs).
fn rebuild_totals(device: usize, segments: &[LoadedSegment], events: &mut [MemoryEvent]) {
    let mine = segments.iter().filter(|s| s.device == device);
    let end_allocated: i128 = mine
        .clone()
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state == "active_allocated")
        .map(|b| b.size as i128)
        .sum();
    let end_reserved: i128 = mine.map(|s| s.total_size as i128).sum();
    let delta = |e: &MemoryEvent| -> (i128, i128) {
        let s = e.size as i128;
        match e.kind {
            MemoryEventKind::Alloc => (s, 0),
            MemoryEventKind::FreeRequested => (-s, 0),
            MemoryEventKind::SegmentAlloc => (0, s),
            MemoryEventKind::SegmentFree => (0, -s),
            _ => (0, 0),
        }
    };
    let (net_a, net_r) = events
        .iter()
        .map(delta)
        .fold((0, 0), |(a, r), (da, dr)| (a + da, r + dr));
    let (mut a, mut r) = (end_allocated - net_a, end_reserved - net_r);
    for e in events.iter_mut() {
        let (da, dr) = delta(e);
        a += da;
        r += dr;
        e.allocated_after = a.clamp(0, usize::MAX as i128) as usize;
        e.reserved_after = r.clamp(0, usize::MAX as i128) as usize;
    }
}

/// Reads the snapshot file at `path`.
pub fn read_snapshot_file(path: &Path) -> Result<LoadedSnapshot, SnapshotFileError> {
    let bytes = std::fs::read(path).map_err(|source| SnapshotFileError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    read_snapshot(&bytes)
}
