//! The registry of page-locked host ranges (`cuMemHostAlloc`, `cuMemHostRegister`), which
//! copies consult to decide whether they may run asynchronously.
//!
//! Invariants: ranges never overlap (memory.rs checks before inserting); an entry exists exactly
//! while its range is page-locked.

use std::collections::BTreeMap;
use std::sync::RwLock;

/// Page-locked host ranges: start → (length, allocated by `cuMemHostAlloc`).
pub(super) static PINNED: RwLock<BTreeMap<usize, (usize, bool)>> = RwLock::new(BTreeMap::new());

/// True when `[ptr, ptr + len)` lies inside one page-locked range.
pub(super) fn is_pinned(ptr: usize, len: usize) -> bool {
    let pinned = PINNED.read().unwrap_or_else(|e| e.into_inner());
    pinned
        .range(..=ptr)
        .next_back()
        .is_some_and(|(&s, &(l, _))| ptr + len <= s + l)
}
