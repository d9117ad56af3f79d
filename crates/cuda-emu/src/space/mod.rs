//! Device address space: where emulated device memory lives and which of it is live.
//!
//! Invariants:
//! - Each emulated device (driver ordinal `d`) owns the span `[SPAN_BASE + d * SPAN_BYTES,
//!   SPAN_BASE + (d + 1) * SPAN_BYTES)`, reserved at `init` with `PROT_NONE` and
//!   `MAP_NORESERVE`, so nothing else in the process is ever placed there and every address in it
//!   faults unless made accessible below.
//! - A `cuMemAlloc` allocation (`alloc`) is readable and writable only while it is live; its
//!   end (its size rounded up to 256 bytes) abuts an inaccessible guard page and its start is
//!   256-byte aligned. `free` makes its pages inaccessible again and discards their contents.
//! - VMM memory is accessible exactly while a physical allocation is mapped into a reservation
//!   (`reserve`) and access was granted; the driver publishes and withdraws such ranges with
//!   `publish_mapping` / `withdraw_mapping`.
//! - The registry of live ranges is the single source of truth for [`check_device_range`]; the
//!   emulator's own code dereferences a device address only after that check passed.
//! - Bytes charged against a device's capacity (`charge`) never exceed `capacity`.

mod registry;
mod span;

use std::fmt;

pub(crate) use registry::{publish_mapping, range_of, withdraw_mapping};
pub(crate) use span::{
    alloc, allocation_device, capacity, charge, discard, free, init, reserve, uncharge, unreserve,
    used, SpaceError, SPAN_BYTES,
};

/// Why a device range cannot be touched: names the address and what it hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessError {
    /// Human-readable reason, e.g. "0x2000_0000_1000 + 64 bytes runs 16 bytes past the end of the
    /// 48-byte allocation at 0x2000_0000_0fd0 on device 0".
    pub message: String,
}

impl fmt::Display for AccessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Ok when `[ptr, ptr + len)` lies inside one live device allocation (of any device) and is
/// mapped readable and writable; `len == 0` needs only `ptr` inside or at the end of one.
/// Adjacent VMM mappings that are all accessible count as one allocation.
pub fn check_device_range(ptr: u64, len: u64) -> Result<(), AccessError> {
    registry::check(ptr, len, span::span_device).map_err(|message| AccessError { message })
}

/// The device ordinal whose address span holds `ptr`, whether or not it is allocated (for a
/// mapped VMM range: the device of the physical memory mapped there).
pub fn device_of(ptr: u64) -> Option<i32> {
    registry::device_at(ptr).or_else(|| span::span_device(ptr))
}

/// Runs `f` while every range of `ranges` is live and stays live (frees and unmaps wait for `f`
/// to return); the error names the first range that is not live.
pub(crate) fn with_live<R>(ranges: &[(u64, u64)], f: impl FnOnce() -> R) -> Result<R, String> {
    registry::with_live(ranges, span::span_device, f)
}
