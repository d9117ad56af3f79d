//! The stitched blocks behind the allocator's lock (`stitched.rs` holds the logic and states
//! the invariants): a leaf module, so the allocator's state can hold it without the logic's
//! dependencies.

use crate::page_runs::PageRuns;

/// Whole pages `[p0, p1)` of expandable segment `seg`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Run {
    pub seg: u32,
    pub p0: usize,
    pub p1: usize,
}

/// One stitched block and where its memory lies.
#[derive(Debug, Clone)]
pub(crate) struct Stitched {
    /// Slab id of the block (segment [`ALIAS_SEGMENT`](crate::slab::ALIAS_SEGMENT)).
    pub block: u32,
    /// The pages whose memory the block reaches, in the block's address order.
    pub runs: Vec<Run>,
    /// While in use: the `Lent` block of each run, same order. Empty while cached.
    pub lent: Vec<u32>,
    /// Allocator clock at the last hand-out or free (least recently used goes first).
    pub used_at: u64,
}

/// Every stitched block, and the address space they live in.
#[derive(Debug, Default)]
pub(crate) struct StitchedCache {
    /// The alias address space `(base, bytes)`, reserved on first use.
    pub space: Option<(u64, usize)>,
    /// Pages of the alias space in use by stitched blocks.
    pub used: PageRuns,
    /// The stitched blocks, in use and cached.
    pub blocks: Vec<Stitched>,
}
