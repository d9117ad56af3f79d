//! Per-device reserved spans, the placement of allocations inside them (next fit: the first
//! free range at or after where the last placement ended, wrapping around, so a freed address is
//! reused only after the whole span has been cycled through and a stale pointer keeps
//! faulting), and each device's capacity accounting.
//!
//! Invariants: a span's free list holds page-aligned, non-overlapping, coalesced extents of
//! addresses no allocation or reservation uses; every placed region ends with one guard page that
//! stays `PROT_NONE`; `used` of a device is the sum of the 256-rounded sizes of its live
//! allocations plus its live VMM physical allocations, and never exceeds the capacity.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use super::registry;

/// Start of device 0's span.
pub(crate) const SPAN_BASE: u64 = 0x2000_0000_0000;
/// Bytes of address space each device owns.
pub(crate) const SPAN_BYTES: u64 = 1 << 40;
/// Alignment (and size rounding) of `cuMemAlloc` allocations.
const ALLOC_ALIGN: u64 = 256;
/// The byte every new allocation is filled with (see [`alloc`]).
pub(crate) const POISON: u8 = 0xff;

/// Why the address space refused a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SpaceError {
    /// [`init`] has not run (or failed).
    NotInitialised,
    /// The device's capacity is exhausted.
    OutOfMemory {
        /// Bytes asked for (after rounding).
        requested: u64,
        /// Bytes still free on the device.
        free: u64,
    },
    /// The span has no free extent that large, or the kernel refused to map it (e.g. too many
    /// mappings); the message says which.
    AddressSpace(String),
    /// The pointer is not the start of a live allocation.
    NotAllocated,
}

struct Region {
    start: u64,
    len: u64,
    device: usize,
    charged: u64,
}

struct DeviceSpan {
    free: Mutex<FreeList>,
    used: AtomicU64,
}

struct Space {
    devices: Vec<DeviceSpan>,
    capacity: u64,
    page: u64,
    /// Region of every live allocation, by the pointer handed out.
    allocs: Mutex<HashMap<u64, Region>>,
}

static SPACE: OnceLock<Space> = OnceLock::new();

fn space() -> Result<&'static Space, SpaceError> {
    SPACE.get().ok_or(SpaceError::NotInitialised)
}

fn round_up(value: u64, to: u64) -> u64 {
    value.div_ceil(to) * to
}

/// The host page size (the granularity of protection and guard pages).
pub(crate) fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if page > 0 {
        page as u64
    } else {
        4096
    }
}

/// Reserves the spans of `devices` devices with `capacity` bytes each. Idempotent: a second call
/// keeps the first configuration.
pub(crate) fn init(devices: usize, capacity: u64) -> Result<(), String> {
    if SPACE.get().is_some() {
        return Ok(());
    }
    let max = ((0x7000_0000_0000 - SPAN_BASE) / SPAN_BYTES) as usize;
    if devices > max {
        return Err(format!(
            "{devices} devices do not fit the address space (at most {max})"
        ));
    }
    let page = page_size();
    let mut spans = Vec::with_capacity(devices);
    for d in 0..devices {
        let base = SPAN_BASE + d as u64 * SPAN_BYTES;
        // SAFETY: a fresh anonymous mapping at an address nothing else may use (NOREPLACE).
        let got = unsafe {
            libc::mmap(
                base as *mut libc::c_void,
                SPAN_BYTES as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE
                    | libc::MAP_ANONYMOUS
                    | libc::MAP_NORESERVE
                    | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if got == libc::MAP_FAILED || got as u64 != base {
            let err = std::io::Error::last_os_error();
            if got != libc::MAP_FAILED {
                // SAFETY: unmapping the mapping just made, at the address the kernel chose.
                unsafe { libc::munmap(got, SPAN_BYTES as usize) };
            }
            return Err(format!(
                "cannot reserve device {d}'s address span at 0x{base:x}: {err}"
            ));
        }
        spans.push(DeviceSpan {
            free: Mutex::new(FreeList::new(base, SPAN_BYTES)),
            used: AtomicU64::new(0),
        });
    }
    let space = Space {
        devices: spans,
        capacity,
        page,
        allocs: Mutex::new(HashMap::new()),
    };
    // A racing init lost: its spans stay reserved but unused, which is harmless.
    let _ = SPACE.set(space);
    Ok(())
}

/// The device whose span holds `ptr`.
pub(super) fn span_device(ptr: u64) -> Option<i32> {
    let space = SPACE.get()?;
    let d = ptr.checked_sub(SPAN_BASE)? / SPAN_BYTES;
    (d < space.devices.len() as u64).then_some(d as i32)
}

/// Bytes of device memory each device has.
pub(crate) fn capacity() -> u64 {
    SPACE.get().map_or(0, |s| s.capacity)
}

/// Bytes of `device`'s capacity in use.
pub(crate) fn used(device: usize) -> u64 {
    SPACE
        .get()
        .and_then(|s| s.devices.get(device))
        .map_or(0, |d| d.used.load(Ordering::SeqCst))
}

/// Charges `bytes` against `device`'s capacity.
pub(crate) fn charge(device: usize, bytes: u64) -> Result<(), SpaceError> {
    let space = space()?;
    let dev = space
        .devices
        .get(device)
        .ok_or(SpaceError::NotInitialised)?;
    dev.used
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
            u.checked_add(bytes).filter(|&n| n <= space.capacity)
        })
        .map(|_| ())
        .map_err(|u| SpaceError::OutOfMemory {
            requested: bytes,
            free: space.capacity - u,
        })
}

/// Gives `bytes` of `device`'s capacity back.
pub(crate) fn uncharge(device: usize, bytes: u64) {
    if let Some(dev) = SPACE.get().and_then(|s| s.devices.get(device)) {
        let _ = dev
            .used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                Some(u.saturating_sub(bytes))
            });
    }
}

/// A span's unused addresses: page-aligned, coalesced extents, and where the last placement
/// ended.
struct FreeList {
    extents: BTreeMap<u64, u64>,
    cursor: u64,
}

impl FreeList {
    fn new(start: u64, len: u64) -> Self {
        let mut extents = BTreeMap::new();
        extents.insert(start, len);
        FreeList {
            extents,
            cursor: start,
        }
    }

    /// Next fit: the first extent at or after the cursor with room for `len` bytes aligned to
    /// `align`, wrapping around to the span's start; removes and returns that range.
    fn take(&mut self, len: u64, align: u64) -> Option<u64> {
        let fits = |s: u64, l: u64, from: u64| {
            let a = round_up(s.max(from), align);
            (a.checked_add(len)? <= s + l).then_some((s, l, a))
        };
        let c = self.cursor;
        let (s, l, a) = self
            .extents
            .range(..=c)
            .next_back()
            .and_then(|(&s, &l)| fits(s, l, c))
            .or_else(|| {
                self.extents
                    .range(c + 1..)
                    .find_map(|(&s, &l)| fits(s, l, 0))
            })
            .or_else(|| self.extents.range(..=c).find_map(|(&s, &l)| fits(s, l, 0)))?;
        self.extents.remove(&s);
        if a > s {
            self.extents.insert(s, a - s);
        }
        if a + len < s + l {
            self.extents.insert(a + len, s + l - a - len);
        }
        self.cursor = a + len;
        Some(a)
    }

    /// Returns `[start, start + len)`, merging it with its neighbours.
    fn give(&mut self, mut start: u64, mut len: u64) {
        if let Some((&ps, &pl)) = self.extents.range(..start).next_back() {
            if ps + pl == start {
                self.extents.remove(&ps);
                start = ps;
                len += pl;
            }
        }
        if let Some(nl) = self.extents.remove(&(start + len)) {
            len += nl;
        }
        self.extents.insert(start, len);
    }
}

fn protect(start: u64, len: u64, prot: libc::c_int) -> std::io::Result<()> {
    // SAFETY: the range is page-aligned and inside a span this module reserved.
    let rc = unsafe { libc::mprotect(start as *mut libc::c_void, len as usize, prot) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Makes `[start, start + len)` inaccessible again and drops its contents (fresh `PROT_NONE`
/// anonymous pages). `pub(crate)` for the driver's VMM unmap.
pub(crate) fn discard(start: u64, len: u64) -> std::io::Result<()> {
    // SAFETY: replaces pages inside a span this module reserved; nothing else maps there.
    let got = unsafe {
        libc::mmap(
            start as *mut libc::c_void,
            len as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if got == libc::MAP_FAILED {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Allocates `size` bytes (> 0) on `device`: readable and writable, 256-aligned, its 256-rounded
/// end abutting a guard page, every byte [`POISON`].
pub(crate) fn alloc(device: usize, size: u64) -> Result<u64, SpaceError> {
    let space = space()?;
    let dev = space
        .devices
        .get(device)
        .ok_or(SpaceError::NotInitialised)?;
    let rounded = round_up(size.max(1), ALLOC_ALIGN);
    charge(device, rounded)?;
    let body = round_up(rounded, space.page);
    let region_len = body + space.page;
    let placed = dev
        .free
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take(region_len, space.page);
    let Some(region) = placed else {
        uncharge(device, rounded);
        return Err(SpaceError::AddressSpace(format!(
            "device {device}'s address span has no free extent of {region_len} bytes"
        )));
    };
    if let Err(e) = protect(region, body, libc::PROT_READ | libc::PROT_WRITE) {
        dev.free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .give(region, region_len);
        uncharge(device, rounded);
        return Err(SpaceError::AddressSpace(format!(
            "mprotect of {body} bytes at 0x{region:x} failed: {e}"
        )));
    }
    let ptr = region + body - rounded;
    // Fresh device memory holds whatever the last user left, never zeros: fill it with 0xff
    // (NaN in every float dtype, -1 in every integer one) so a kernel or copy that reads memory
    // nothing wrote shows, instead of seeing the zeros fresh host pages hold.
    // SAFETY: [ptr, ptr + rounded) was just made readable and writable above and no one else
    // knows the address yet.
    unsafe { std::ptr::write_bytes(ptr as *mut u8, POISON, rounded as usize) };
    space
        .allocs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(
            ptr,
            Region {
                start: region,
                len: region_len,
                device,
                charged: rounded,
            },
        );
    registry::insert_alloc(ptr, size, device as i32);
    Ok(ptr)
}

/// The device of the live allocation starting exactly at `ptr`.
pub(crate) fn allocation_device(ptr: u64) -> Option<usize> {
    let space = SPACE.get()?;
    let allocs = space.allocs.lock().unwrap_or_else(|e| e.into_inner());
    allocs.get(&ptr).map(|r| r.device)
}

/// Frees the allocation starting at `ptr`; returns its device.
pub(crate) fn free(ptr: u64) -> Result<usize, SpaceError> {
    let space = space()?;
    let region = space
        .allocs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&ptr)
        .ok_or(SpaceError::NotAllocated)?;
    registry::remove_alloc(ptr);
    let body = region.len - space.page;
    if let Err(e) = discard(region.start, body) {
        crate::driver::log(&format!("cannot discard freed memory at 0x{ptr:x}: {e}"));
    }
    let dev = &space.devices[region.device];
    dev.free
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .give(region.start, region.len);
    uncharge(region.device, region.charged);
    Ok(region.device)
}

/// Reserves `size` bytes of `device`'s span aligned to `align` (a power of two) for VMM
/// mappings; the reservation is followed by a guard page and stays inaccessible until mapped.
pub(crate) fn reserve(device: usize, size: u64, align: u64) -> Result<u64, SpaceError> {
    let space = space()?;
    let dev = space
        .devices
        .get(device)
        .ok_or(SpaceError::NotInitialised)?;
    let align = align.max(space.page);
    dev.free
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take(size + space.page, align)
        .ok_or_else(|| {
            SpaceError::AddressSpace(format!(
            "device {device}'s address span has no free extent of {size} bytes aligned to {align}"
        ))
        })
}

/// Returns a reservation made by [`reserve`] (nothing may be mapped in it).
pub(crate) fn unreserve(device: usize, start: u64, size: u64) {
    if let Ok(space) = space() {
        if let Some(dev) = space.devices.get(device) {
            let mut free = dev.free.lock().unwrap_or_else(|e| e.into_inner());
            free.give(start, size + space.page);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_fit_splits_coalesces_and_moves_on() {
        let mut free = FreeList::new(0x1000, 0x10000);
        assert_eq!(free.take(0x2000, 0x1000), Some(0x1000));
        assert_eq!(free.take(0x1000, 0x4000), Some(0x4000));
        assert_eq!(free.extents.get(&0x3000), Some(&0x1000));
        free.give(0x1000, 0x2000);
        assert_eq!(
            free.take(0x1000, 0x1000),
            Some(0x5000),
            "freed addresses wait their turn"
        );
        free.give(0x4000, 0x1000);
        free.give(0x5000, 0x1000);
        assert_eq!(
            free.extents.clone().into_iter().collect::<Vec<_>>(),
            vec![(0x1000, 0x10000)]
        );
        assert_eq!(free.take(0xc000, 0x1000), Some(0x1000), "wraps around");
    }
}
