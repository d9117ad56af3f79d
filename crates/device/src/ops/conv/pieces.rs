//! How the CPU convolution passes spread their work over the pool: images (or slices of
//! images) one rayon task each when the batch fills whole rounds of the pool, and an image's
//! own copies, sums and products split over the pool when it runs alone (a batch smaller than
//! the pool, or the images left over past the whole rounds).
//!
//! Invariants: every image and every piece is visited once with its index; the images run one
//! task each come first, the split ones after them in batch order; what the split changes is
//! which thread runs which image or piece, which images share a chunk's product, and how the
//! weight gradient's images are sliced into partials (so the order of its float sums).

use crate::ops::gemm::Parallelism;
use std::ops::Range;

/// How many of a pass's `batch` images run one task each on a pool of `threads`, the first
/// ones: none when the batch is smaller than the pool (every image is split over it); else
/// whole rounds of the pool, and the images past them (`batch % threads`) split over the pool
/// one after another when they would fill at most half of one more round (a third image on two
/// threads then takes about half an image's time instead of a whole one; the rule breaks even
/// where a split image runs at half the pool's speed, and batch-1 images ran at 0.8-0.9 of it
/// on two threads), else in parallel with the others.
pub(super) fn images_in_parallel(batch: usize, threads: usize) -> usize {
    let threads = threads.max(1);
    if batch < threads {
        return 0;
    }
    let rest = batch % threads;
    if 2 * rest <= threads {
        batch - rest
    } else {
        batch
    }
}

/// Images per chunk for a pass that runs `batch` images one chunk after another, at most
/// `most` per chunk (clamped to `1..=batch`): as few chunks as that allows, as even as that
/// many chunks can be. 32 images at most 10 per chunk need 4 chunks and get 8 each (not 10,
/// 10, 10 and 2); at most 7, 5 chunks of 7 (the last of 4).
pub(super) fn evened_chunk(batch: usize, most: usize) -> usize {
    let most = most.clamp(1, batch.max(1));
    match batch.div_ceil(most) {
        // No images: a chunk of one (nothing to divide among no chunks).
        0 => 1,
        chunks => batch.div_ceil(chunks),
    }
}

/// `gemm` parallelism of one image's products: the whole pool when the image is `split` over
/// it (none on one thread), else none (the image is one task of a parallel loop).
pub(super) fn image_parallelism(split: bool) -> Parallelism {
    match split {
        true => pool_parallelism(),
        false => Parallelism::None,
    }
}

/// How many of `batch` images [`for_each_chunk`] runs in chunks one task each on a pool of
/// `threads`: all of them when the batch is smaller than the pool (the chunks then share the
/// threads), else [`images_in_parallel`].
pub(super) fn chunked_images_in_parallel(batch: usize, threads: usize) -> usize {
    match batch < threads.max(1) {
        true => batch,
        false => images_in_parallel(batch, threads),
    }
}

/// Whether `parallelism` spreads a product over the pool: the image's or chunk's other work
/// (its copies and sums) then goes on the pool too.
pub(super) fn is_split(parallelism: Parallelism) -> bool {
    !matches!(parallelism, Parallelism::None)
}

/// `gemm` parallelism that splits each product over the whole pool (none on one thread): for
/// passes whose products run one after another.
pub(super) fn pool_parallelism() -> Parallelism {
    match rayon::current_num_threads() {
        0 | 1 => Parallelism::None,
        n => Parallelism::Rayon(n),
    }
}

/// Runs `one_image(scratch, n, out, split)` for every image `n` of `output` (blocks of
/// `out_image` elements), spread as [`images_in_parallel`] says: the first images one rayon
/// task each, with one scratch per task (`split` false), the rest one after another with one
/// scratch, each spread over the pool (`split` true).
pub(super) fn for_each_image<T: Send, S>(
    output: &mut [T],
    out_image: usize,
    scratch: impl Fn() -> S + Sync + Send,
    one_image: impl Fn(&mut S, usize, &mut [T], bool) + Sync + Send,
) {
    if out_image == 0 {
        return;
    }
    let batch = output.len() / out_image;
    let parallel = images_in_parallel(batch, rayon::current_num_threads());
    let (whole_rounds, rest) = output.split_at_mut(parallel * out_image);
    crate::ops::par::chunks_mut_with(whole_rounds, out_image, &scratch, &|s, n, out| {
        one_image(s, n, out, false)
    });
    if !rest.is_empty() {
        let mut s = scratch();
        for (i, out) in rest.chunks_mut(out_image).enumerate() {
            one_image(&mut s, parallel + i, out, true);
        }
    }
}

/// Runs `body(scratch, first, out, parallelism)` over the images of `output` (`image`
/// elements each) in chunks of at most `chunk` images, `first` being a chunk's first image.
/// The images [`chunked_images_in_parallel`] counts go in chunks of `chunk`, one rayon task each with one scratch per task, each
/// chunk's products split over its share of the pool when the chunks do not fill it; the
/// images left go in chunks one after another with one scratch, each split over the pool.
pub(super) fn for_each_chunk<T: Send, S>(
    output: &mut [T],
    image: usize,
    chunk: usize,
    scratch: impl Fn() -> S + Sync + Send,
    body: impl Fn(&mut S, usize, &mut [T], Parallelism) + Sync + Send,
) {
    if image == 0 || chunk == 0 {
        return;
    }
    let batch = output.len() / image;
    let threads = rayon::current_num_threads().max(1);
    let parallel = chunked_images_in_parallel(batch, threads);
    let chunks = parallel.div_ceil(chunk);
    let shared = match chunks < threads {
        true => Parallelism::Rayon(threads.div_ceil(chunks.max(1))),
        false => Parallelism::None,
    };
    let (whole_rounds, rest) = output.split_at_mut(parallel * image);
    crate::ops::par::chunks_mut_with(whole_rounds, chunk * image, &scratch, &|s, c, out| {
        body(s, c * chunk, out, shared)
    });
    if !rest.is_empty() {
        let mut s = scratch();
        for (c, out) in rest.chunks_mut(chunk * image).enumerate() {
            body(&mut s, parallel + c * chunk, out, pool_parallelism());
        }
    }
}

/// The partial weight gradients of a batch of `batch` images: `slice(images, parallelism)`
/// sums a contiguous range of images into one partial. The images [`images_in_parallel`] runs
/// in parallel are cut into one slice per thread (the same number of images each but the
/// last), each computed by one task without splitting its products; the rest form one more
/// slice, computed after them with its products split over the pool. The partials come in
/// batch order.
pub(super) fn weight_grad_partials<P: Send>(
    batch: usize,
    slice: impl Fn(Range<usize>, Parallelism) -> crate::Result<P> + Sync + Send,
) -> crate::Result<Vec<P>> {
    let threads = rayon::current_num_threads().max(1);
    let parallel = images_in_parallel(batch, threads);
    let mut partials = if parallel > 0 {
        let per_slice = parallel.div_ceil(threads);
        crate::ops::par::map(parallel.div_ceil(per_slice), &|s| {
            slice(
                s * per_slice..((s + 1) * per_slice).min(parallel),
                Parallelism::None,
            )
        })
        .into_iter()
        .collect::<crate::Result<Vec<_>>>()?
    } else {
        Vec::new()
    };
    if parallel < batch || partials.is_empty() {
        partials.push(slice(parallel..batch, image_parallelism(true))?);
    }
    Ok(partials)
}

/// Runs `body(i, piece)` over the `size`-element pieces of `data`: on the pool when `parallel`
/// (work of one image or chunk that runs alone: a batch smaller than the pool, the images past
/// its whole rounds, or the weight gradient's chunks one after another), else in order on this
/// thread (work that already is one task of a parallel loop).
pub(super) fn for_each_piece<T: Send>(
    data: &mut [T],
    size: usize,
    parallel: bool,
    body: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    let size = size.max(1);
    if parallel {
        crate::ops::par::chunks_mut(data, size, &body);
    } else {
        data.chunks_mut(size)
            .enumerate()
            .for_each(|(i, piece)| body(i, piece));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn on_pool<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(f)
    }

    /// As few chunks as the cap allows, as even as they can be; the cap clamped to the batch.
    #[test]
    fn evened_chunks_are_the_fewest_and_as_even_as_they_can_be() {
        // (batch, most, chunk)
        let cases = [
            (32, 10, 8),
            (32, 7, 7),
            (32, 32, 32),
            (32, 100, 32),
            (32, 0, 1),
            (7, 3, 3),
        ];
        for (batch, most, chunk) in cases {
            assert_eq!(evened_chunk(batch, most), chunk, "{batch} at most {most}");
        }
        // No images: a chunk of one, not a division by zero.
        assert_eq!(evened_chunk(0, 5), 1);
    }

    /// Whole rounds of the pool in parallel; the images past them split while they fill at
    /// most half a round; a batch smaller than the pool all split; one thread all in order.
    #[test]
    fn images_in_parallel_keeps_whole_rounds_and_splits_a_short_remainder() {
        let cases = [
            // (batch, threads, in parallel)
            (3, 2, 2),
            (5, 2, 4),
            (4, 2, 4),
            (1, 2, 0),
            (20, 16, 16),
            (24, 16, 16),
            (25, 16, 25),
            (31, 16, 31),
            (8, 16, 0),
            (32, 16, 32),
            (7, 1, 7),
            (0, 2, 0),
        ];
        for (batch, threads, parallel) in cases {
            assert_eq!(
                images_in_parallel(batch, threads),
                parallel,
                "{batch} images on {threads} threads"
            );
        }
    }

    /// Every image visited once with its own block: those in whole rounds as tasks, the rest
    /// split, in order after them.
    #[test]
    fn for_each_image_visits_every_image_once_split_past_the_whole_rounds() {
        for (batch, threads) in [(3, 2), (5, 2), (4, 2), (1, 2), (5, 4), (7, 4), (3, 1)] {
            let parallel = images_in_parallel(batch, threads);
            let seen = Mutex::new(Vec::new());
            let mut out = vec![0usize; batch * 3];
            on_pool(threads, || {
                for_each_image(
                    &mut out,
                    3,
                    || (),
                    |_, n, block, split| {
                        block.fill(n + 1);
                        seen.lock().unwrap().push((n, split));
                    },
                );
            });
            let mut seen = seen.into_inner().unwrap();
            let split: Vec<usize> = seen.iter().filter(|s| s.1).map(|s| s.0).collect();
            assert_eq!(
                split,
                (parallel..batch).collect::<Vec<_>>(),
                "{batch} on {threads}"
            );
            seen.sort();
            let expected: Vec<_> = (0..batch).map(|n| (n, n >= parallel)).collect();
            assert_eq!(seen, expected, "{batch} on {threads}");
            let filled: Vec<usize> = (0..batch).flat_map(|n| [n + 1; 3]).collect();
            assert_eq!(out, filled);
        }
    }

    /// Chunks in whole rounds run as tasks (products split over each chunk's share of the
    /// pool when they do not fill it), the images left in split chunks after them; every image
    /// in exactly one chunk of at most `chunk` images.
    #[test]
    fn for_each_chunk_splits_the_chunks_past_the_whole_rounds() {
        // (batch, threads, chunk, expected (first, images, parallelism) sorted by first image)
        let r = Parallelism::Rayon;
        let none = Parallelism::None;
        let cases = [
            (3, 2, 2, vec![(0, 2, r(2)), (2, 1, r(2))]),
            (5, 2, 2, vec![(0, 2, none), (2, 2, none), (4, 1, r(2))]),
            (4, 2, 3, vec![(0, 3, none), (3, 1, none)]),
            (3, 4, 2, vec![(0, 2, r(2)), (2, 1, r(2))]),
            (
                7,
                4,
                2,
                vec![(0, 2, none), (2, 2, none), (4, 2, none), (6, 1, none)],
            ),
            (5, 4, 2, vec![(0, 2, r(2)), (2, 2, r(2)), (4, 1, r(4))]),
            (5, 1, 2, vec![(0, 2, none), (2, 2, none), (4, 1, none)]),
        ];
        for (batch, threads, chunk, expected) in cases {
            let seen = Mutex::new(Vec::new());
            let mut out = vec![0usize; batch * 2];
            on_pool(threads, || {
                for_each_chunk(
                    &mut out,
                    2,
                    chunk,
                    || (),
                    |_, first, block, parallelism| {
                        let images = block.len() / 2;
                        block.fill(first + 1);
                        seen.lock().unwrap().push((first, images, parallelism));
                    },
                );
            });
            let mut seen = seen.into_inner().unwrap();
            seen.sort_by_key(|s| s.0);
            let key = |v: &[(usize, usize, Parallelism)]| -> Vec<(usize, usize, Option<usize>)> {
                v.iter()
                    .map(|&(f, n, p)| match p {
                        Parallelism::Rayon(t) => (f, n, Some(t)),
                        _ => (f, n, None),
                    })
                    .collect()
            };
            assert_eq!(key(&seen), key(&expected), "{batch} on {threads}");
            let filled: Vec<usize> = seen
                .iter()
                .flat_map(|&(first, images, _)| vec![first + 1; 2 * images])
                .collect();
            assert_eq!(out, filled);
        }
    }

    /// Weight-gradient slices: one per thread over the whole rounds, then one split slice for
    /// the images left; in batch order, covering every image once.
    #[test]
    fn weight_grad_partials_cover_the_batch_in_order() {
        let cases = [
            (3, 2, vec![(0..1, false), (1..2, false), (2..3, true)]),
            (4, 2, vec![(0..2, false), (2..4, false)]),
            (
                7,
                4,
                vec![(0..2, false), (2..4, false), (4..6, false), (6..7, false)],
            ),
            (2, 4, vec![(0..2, true)]),
            (0, 2, vec![(0..0, true)]),
            (3, 1, vec![(0..3, false)]),
        ];
        for (batch, threads, expected) in cases {
            let slices = on_pool(threads, || {
                weight_grad_partials(batch, |images, parallelism| {
                    Ok((images, is_split(parallelism)))
                })
            })
            .unwrap();
            assert_eq!(slices, expected, "{batch} on {threads}");
        }
    }
}
