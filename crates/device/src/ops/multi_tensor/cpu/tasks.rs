//! How the CPU multi-tensor passes cut a list into the pool's tasks: chunks of at most
//! `CHUNK_ELEMS` elements, consecutive chunks grouped into tasks of at least that many.
//!
//! Invariants: grouping never reorders chunks, and it decides only who computes a chunk, never
//! how, so results do not depend on it.

use crate::ops::multi_tensor::{batch_ranges, CHUNK_ELEMS};
use crate::{CpuStorage, Layout};

/// Consecutive chunks grouped into tasks of at least `CHUNK_ELEMS` elements ([`batch_ranges`]),
/// in list order: what a parallel pass over small chunks hands to the pool.
pub(super) fn into_tasks<C>(chunks: Vec<C>, len: impl Fn(&C) -> usize) -> Vec<Vec<C>> {
    let ranges = batch_ranges(chunks.iter().map(len), CHUNK_ELEMS);
    let mut it = chunks.into_iter();
    ranges
        .into_iter()
        .map(|r| it.by_ref().take(r.len()).collect())
        .collect()
}

/// How many `CHUNK_ELEMS` chunks the parameters of a step are cut into, to size its chunk list
/// up front: a list of thousands of parameters grew that vector by doubling, and its
/// reallocations (past the system allocator's mmap threshold) faulted fresh pages every step.
/// Counted from the buffers' real lengths, not only the layouts (the pass checks them), so a
/// layout that claims more than its buffer holds gets its error, not a huge reservation.
pub(super) fn chunk_count<'a>(params: impl Iterator<Item = (&'a CpuStorage, &'a Layout)>) -> usize {
    params
        .map(|(st, layout)| layout.numel().min(st.len()).div_ceil(CHUNK_ELEMS))
        .sum()
}
