//! The registry of live device ranges: every `cuMemAlloc` allocation and every accessible VMM
//! mapping, keyed by start address.
//!
//! Invariants: entries never overlap; an entry exists exactly while its pages are readable and
//! writable (it is inserted after `mprotect` made them so and removed before they are made
//! inaccessible again); lookups take a read lock only, so checks from many threads run in
//! parallel; the emulator's own accesses run under that read lock ([`with_live`]), so memory
//! cannot be freed or unmapped under them.

use std::collections::BTreeMap;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The device whose address span holds an address, allocated or not (the span layout lives in
/// `span.rs`, which uses this registry, so the registry is handed the lookup instead).
pub(super) type SpanDevice = fn(u64) -> Option<i32>;

/// What kind of memory a live range is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A `cuMemAlloc` allocation: a range of its own.
    Alloc,
    /// One accessible VMM mapping: adjacent mappings form one contiguous range.
    Mapped,
}

#[derive(Debug, Clone, Copy)]
struct Live {
    len: u64,
    device: i32,
    kind: Kind,
}

static LIVE: RwLock<BTreeMap<u64, Live>> = RwLock::new(BTreeMap::new());

fn read() -> RwLockReadGuard<'static, BTreeMap<u64, Live>> {
    LIVE.read().unwrap_or_else(|e| e.into_inner())
}

fn write() -> RwLockWriteGuard<'static, BTreeMap<u64, Live>> {
    LIVE.write().unwrap_or_else(|e| e.into_inner())
}

/// Records the allocation `[start, start + len)` of `device` as live.
pub(super) fn insert_alloc(start: u64, len: u64, device: i32) {
    let kind = Kind::Alloc;
    write().insert(start, Live { len, device, kind });
}

/// Forgets the allocation starting exactly at `start`; false when there is none.
pub(super) fn remove_alloc(start: u64) -> bool {
    let mut live = write();
    match live.get(&start) {
        Some(l) if l.kind == Kind::Alloc => {
            live.remove(&start);
            true
        }
        _ => false,
    }
}

/// Records the accessible VMM mapping `[start, start + len)` of `device`'s physical memory.
pub(crate) fn publish_mapping(start: u64, len: u64, device: i32) {
    let kind = Kind::Mapped;
    write().insert(start, Live { len, device, kind });
}

/// Forgets every VMM mapping that starts inside `[start, start + len)`.
pub(crate) fn withdraw_mapping(start: u64, len: u64) {
    let mut live = write();
    let keys: Vec<u64> = live
        .range(start..start.saturating_add(len))
        .filter(|(_, l)| l.kind == Kind::Mapped)
        .map(|(&k, _)| k)
        .collect();
    for k in keys {
        live.remove(&k);
    }
}

/// The device of the live range holding `ptr`, if any.
pub(super) fn device_at(ptr: u64) -> Option<i32> {
    let live = read();
    let (&start, l) = live.range(..=ptr).next_back()?;
    (ptr < start + l.len).then_some(l.device)
}

/// The live range holding `ptr`: its start, length and device (one mapping for VMM memory).
pub(crate) fn range_of(ptr: u64) -> Option<(u64, u64, i32)> {
    let live = read();
    let (&start, l) = live.range(..=ptr).next_back()?;
    (ptr < start + l.len).then_some((start, l.len, l.device))
}

/// Ok when `[ptr, ptr + len)` is inside one live range (see [`super::check_device_range`]).
/// `span_device` names the device whose span holds an address (for the error message).
pub(super) fn check(ptr: u64, len: u64, span_device: SpanDevice) -> Result<(), String> {
    check_in(&read(), ptr, len, span_device)
}

/// Runs `f` while every range of `ranges` is live and stays live (frees and unmaps wait for `f`
/// to return); the error names the first range that is not live (`span_device` as for [`check`]).
pub(super) fn with_live<R>(
    ranges: &[(u64, u64)],
    span_device: SpanDevice,
    f: impl FnOnce() -> R,
) -> Result<R, String> {
    let live = read();
    for &(ptr, len) in ranges {
        check_in(&live, ptr, len, span_device)?;
    }
    let result = f();
    drop(live);
    Ok(result)
}

fn check_in(
    live: &BTreeMap<u64, Live>,
    ptr: u64,
    len: u64,
    span_device: SpanDevice,
) -> Result<(), String> {
    let Some(wanted_end) = ptr.checked_add(len) else {
        return Err(format!(
            "0x{ptr:x} + {len} bytes wraps around the address space"
        ));
    };
    if let Some((&start, first)) = live.range(..=ptr).next_back() {
        let mut end = start + first.len;
        let inside = if len == 0 { ptr <= end } else { ptr < end };
        if inside {
            if first.kind == Kind::Mapped {
                while end < wanted_end {
                    match live.get(&end) {
                        Some(next) if next.kind == Kind::Mapped => end += next.len,
                        _ => break,
                    }
                }
            }
            if wanted_end <= end {
                return Ok(());
            }
            let what = match first.kind {
                Kind::Alloc => "allocation",
                Kind::Mapped => "mapped range",
            };
            return Err(format!(
                "0x{ptr:x} + {len} bytes runs {} bytes past the end of the {}-byte {what} at \
                 0x{start:x} on device {}",
                wanted_end - end,
                end - start,
                first.device
            ));
        }
    }
    Err(match span_device(ptr) {
        Some(d) => format!(
            "0x{ptr:x} + {len} bytes is not inside any live allocation on device {d} (never \
             allocated, already freed, or not mapped with access)"
        ),
        None => format!("0x{ptr:x} is not device memory (a host address?)"),
    })
}
