//! A loop over the pieces of a buffer, on the pool or in order: how the CPU convolution passes
//! spread one image's (or one chunk's) copies and sums over the pool when the batch does not
//! fill it, and keep them on one thread when the image already is one task of a parallel loop.
//!
//! Invariants: every piece is visited once with its index (pieces of `size` elements, the last
//! one shorter); which thread visits which piece is the only thing `parallel` changes.

use rayon::prelude::*;

/// Runs `body(i, piece)` over the `size`-element pieces of `data`: on the pool when `parallel`
/// (work of one image or chunk that runs alone: a batch smaller than the pool, or the weight
/// gradient's chunks one after another), else in order on this thread (work that already is
/// one task of a parallel loop).
pub(super) fn for_each_piece<T: Send>(
    data: &mut [T],
    size: usize,
    parallel: bool,
    body: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    let size = size.max(1);
    if parallel {
        data.par_chunks_mut(size)
            .enumerate()
            .for_each(|(i, piece)| body(i, piece));
    } else {
        data.chunks_mut(size)
            .enumerate()
            .for_each(|(i, piece)| body(i, piece));
    }
}
