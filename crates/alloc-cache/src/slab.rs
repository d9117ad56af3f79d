//! One block's record in the allocator's slab: its address range, owner segment, address-order
//! links, state, and the links of the free-index class list it sits in while free.
//!
//! Invariants: a block is in exactly one state; `prev`/`next` link blocks of one segment in
//! address order; `free_prev`/`free_next` are meaningful only while the block is free; [`NONE`]
//! ends every list.

use crate::stats::PoolKind;

/// Sentinel for "no block" in the intrusive links.
pub(crate) const NONE: u32 = u32::MAX;
/// The `segment` of a stitched block (`stitched.rs`): it lies in the alias address space, in no
/// segment, and is linked to no neighbour.
pub(crate) const ALIAS_SEGMENT: u32 = u32::MAX - 1;
/// The `segment` of a block placed in a planned step's arena (`planner.rs`): it lies inside the
/// arena block, in no segment's list, and is linked to no neighbour.
pub(crate) const ARENA_SEGMENT: u32 = u32::MAX - 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BlockState {
    /// In a pool, available.
    Free,
    /// Handed to a caller.
    Allocated,
    /// Freed by the caller, waiting for events on other streams that used it.
    Pending,
    /// Expandable segments only: page-aligned address space with no memory behind it, in no
    /// pool (`stitch.rs`).
    Unmapped,
    /// Expandable segments only: whole mapped pages of what was a free block, lent to a stitched
    /// block in use, which reaches the same memory at its own addresses (`stitched.rs`); in no
    /// pool, returned to it when the stitched block is freed.
    Lent,
    /// Held as the arena of planned steps (`planner.rs`): neither allocated nor free, in no
    /// pool; the blocks placed in it are counted instead.
    Arena,
    /// Slab slot not in use.
    Dead,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Block {
    pub addr: u64,
    pub size: usize,
    pub requested: usize,
    pub segment: u32,
    pub prev: u32,
    pub next: u32,
    pub state: BlockState,
    pub pool: PoolKind,
    pub stream: u16,
    pub pending_events: u32,
    pub freed_at: u64,
    pub alloc_id: u64,
    /// Links of the free-index class list (meaningful while free).
    pub free_prev: u32,
    pub free_next: u32,
}

impl Block {
    /// A new free block, not yet in any pool.
    pub fn free(
        addr: u64,
        size: usize,
        segment: u32,
        prev: u32,
        pool: PoolKind,
        stream: u16,
        now: u64,
    ) -> Block {
        Block {
            addr,
            size,
            requested: 0,
            segment,
            prev,
            next: NONE,
            state: BlockState::Free,
            pool,
            stream,
            pending_events: 0,
            freed_at: now,
            alloc_id: 0,
            free_prev: NONE,
            free_next: NONE,
        }
    }
}
