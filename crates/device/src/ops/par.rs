//! The parallel loops of the CPU kernels, each compiled once per element type.
//!
//! A rayon chain such as `par_chunks_mut(n).enumerate().for_each(body)` is compiled again for
//! every closure it runs (its jobs, joins and splitting code), and every kernel is generic over
//! its element type: those copies made up about a third of this crate's LLVM IR. The loops here
//! take the body as `&dyn Fn`, so each exists once per element type (and scratch type) and a
//! kernel pays one indirect call per chunk or index, which is always a row, a plane or a block
//! of work.
//!
//! Invariants: each helper runs on the current rayon pool (callers enter kiln's pool with
//! [`crate::threads::install`] or already run on it; the `_if` forms enter it themselves, and
//! only when told to run in parallel), visits every chunk or index exactly once with its
//! position, and splits exactly as the rayon chain named in its doc, so kernels keep their
//! chunking; [`map`] returns results in index order.

use rayon::prelude::*;

/// The body of [`chunks_mut_pair`]: a chunk's index and the two chunks.
pub(crate) type PairBody<'f, A, B> = dyn Fn(usize, &mut [A], &mut [B]) + Sync + 'f;

/// The body of [`chunks_mut_pair_with`]: the task's scratch, a chunk's index and the two chunks.
pub(crate) type PairBodyWith<'f, S, A, B> = dyn Fn(&mut S, usize, &mut [A], &mut [B]) + Sync + 'f;

/// `body(i, chunk)` for every `size`-element chunk of `data` (the last may be shorter), `i`
/// being the chunk's index: `data.par_chunks_mut(size).enumerate().for_each(..)`. `size` must
/// not be zero.
pub(crate) fn chunks_mut<T: Send>(
    data: &mut [T],
    size: usize,
    body: &(dyn Fn(usize, &mut [T]) + Sync),
) {
    data.par_chunks_mut(size)
        .enumerate()
        .for_each(|(i, chunk)| body(i, chunk));
}

/// `body(i, a_chunk, b_chunk)` for the `i`-th `a_size`-element chunk of `a` beside the `i`-th
/// `b_size`-element chunk of `b`, as far as the shorter of the two chunkings goes:
/// `a.par_chunks_mut(a_size).zip(b.par_chunks_mut(b_size)).enumerate().for_each(..)`. Neither
/// size may be zero.
pub(crate) fn chunks_mut_pair<A: Send, B: Send>(
    a: &mut [A],
    a_size: usize,
    b: &mut [B],
    b_size: usize,
    body: &PairBody<'_, A, B>,
) {
    a.par_chunks_mut(a_size)
        .zip(b.par_chunks_mut(b_size))
        .enumerate()
        .for_each(|(i, (a, b))| body(i, a, b));
}

/// [`chunks_mut`] with a scratch: `body(scratch, i, chunk)`, one `init()` per rayon task, reused
/// by the chunks that task runs: `data.par_chunks_mut(size).enumerate().for_each_init(..)`.
pub(crate) fn chunks_mut_with<T: Send, S>(
    data: &mut [T],
    size: usize,
    init: &(dyn Fn() -> S + Sync),
    body: &(dyn Fn(&mut S, usize, &mut [T]) + Sync),
) {
    data.par_chunks_mut(size)
        .enumerate()
        .for_each_init(init, |s, (i, chunk)| body(s, i, chunk));
}

/// [`chunks_mut_pair`] with a scratch per rayon task, as [`chunks_mut_with`].
pub(crate) fn chunks_mut_pair_with<A: Send, B: Send, S>(
    a: &mut [A],
    a_size: usize,
    b: &mut [B],
    b_size: usize,
    init: &(dyn Fn() -> S + Sync),
    body: &PairBodyWith<'_, S, A, B>,
) {
    a.par_chunks_mut(a_size)
        .zip(b.par_chunks_mut(b_size))
        .enumerate()
        .for_each_init(init, |s, (i, (a, b))| body(s, i, a, b));
}

/// [`chunks_mut`] on kiln's pool when `parallel`, else the same chunks in order on this thread:
/// the branch a kernel takes on its size (usually above [`crate::threads::PARALLEL_THRESHOLD`]).
pub(crate) fn chunks_mut_if<T: Send>(
    parallel: bool,
    data: &mut [T],
    size: usize,
    body: &(dyn Fn(usize, &mut [T]) + Sync),
) {
    if parallel {
        crate::threads::install(|| chunks_mut(data, size, body));
    } else {
        for (i, chunk) in data.chunks_mut(size).enumerate() {
            body(i, chunk);
        }
    }
}

/// [`chunks_mut_pair`] on kiln's pool when `parallel`, else the same pairs of chunks in order on
/// this thread, as [`chunks_mut_if`].
pub(crate) fn chunks_mut_pair_if<A: Send, B: Send>(
    parallel: bool,
    a: &mut [A],
    a_size: usize,
    b: &mut [B],
    b_size: usize,
    body: &PairBody<'_, A, B>,
) {
    if parallel {
        crate::threads::install(|| chunks_mut_pair(a, a_size, b, b_size, body));
    } else {
        for (i, (a, b)) in a.chunks_mut(a_size).zip(b.chunks_mut(b_size)).enumerate() {
            body(i, a, b);
        }
    }
}

/// `f(i)` for every `i` in `0..n`, in index order: `(0..n).into_par_iter().map(f).collect()`.
pub(crate) fn map<R: Send>(n: usize, f: &(dyn Fn(usize) -> R + Sync)) -> Vec<R> {
    (0..n).into_par_iter().map(f).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on_pool<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(f)
    }

    #[test]
    fn chunks_mut_visits_every_chunk_once_with_its_index() {
        let mut data = vec![0usize; 10_003];
        on_pool(3, || {
            chunks_mut(&mut data, 100, &|i, chunk| {
                assert!(chunk.len() == 100 || (i == 100 && chunk.len() == 3));
                for (j, v) in chunk.iter_mut().enumerate() {
                    *v += i * 100 + j + 1;
                }
            })
        });
        assert!(data.iter().enumerate().all(|(k, &v)| v == k + 1));
    }

    #[test]
    fn chunks_mut_pair_pairs_chunks_by_index_and_stops_at_the_shorter() {
        let mut a = vec![0usize; 12];
        let mut b = vec![0usize; 10];
        on_pool(2, || {
            chunks_mut_pair(&mut a, 3, &mut b, 5, &|i, a, b| {
                a.fill(i + 1);
                b.fill(10 * (i + 1));
            })
        });
        // b has two chunks of 5, so only a's first two chunks of 3 are visited
        assert_eq!(a, [1, 1, 1, 2, 2, 2, 0, 0, 0, 0, 0, 0]);
        assert_eq!(b, [10, 10, 10, 10, 10, 20, 20, 20, 20, 20]);
    }

    #[test]
    fn scratch_loops_visit_every_chunk_once_and_reuse_a_scratch_per_task() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let made = AtomicUsize::new(0);
        let init = || {
            made.fetch_add(1, Ordering::Relaxed);
            Vec::<usize>::new()
        };
        let mut a = vec![0usize; 1000];
        let mut b = vec![0usize; 500];
        on_pool(2, || {
            chunks_mut_with(&mut a, 10, &init, &|seen, i, chunk| {
                seen.push(i);
                chunk.fill(i);
            });
            chunks_mut_pair_with(&mut a, 10, &mut b, 5, &init, &|seen, i, a, b| {
                seen.push(i);
                a.iter_mut().for_each(|v| *v += 1);
                b.fill(i);
            });
        });
        assert!(a.iter().enumerate().all(|(k, &v)| v == k / 10 + 1));
        assert!(b.iter().enumerate().all(|(k, &v)| v == k / 5));
        // a scratch per task, not per chunk (200 chunks in all)
        assert!(made.load(Ordering::Relaxed) < 200, "{made:?}");
    }

    #[test]
    fn the_if_forms_visit_the_same_chunks_in_parallel_or_in_order_on_this_thread() {
        use std::sync::Mutex;
        for parallel in [false, true] {
            let seen = Mutex::new(Vec::new());
            let caller = std::thread::current().id();
            let mut data = vec![0usize; 1003];
            chunks_mut_if(parallel, &mut data, 10, &|i, chunk| {
                seen.lock()
                    .unwrap()
                    .push((i, std::thread::current().id() == caller));
                chunk
                    .iter_mut()
                    .enumerate()
                    .for_each(|(j, v)| *v = i * 10 + j);
            });
            assert!(data.iter().enumerate().all(|(k, &v)| v == k));
            let mut seen = seen.into_inner().unwrap();
            if !parallel {
                // in order, on the calling thread
                assert!(seen
                    .iter()
                    .enumerate()
                    .all(|(k, &(i, here))| i == k && here));
            }
            seen.sort();
            assert_eq!(seen.len(), 101);
            assert!(seen.iter().enumerate().all(|(k, &(i, _))| i == k));

            let pairs = Mutex::new(Vec::new());
            let (mut a, mut b) = (vec![0usize; 9], vec![0usize; 8]);
            chunks_mut_pair_if(parallel, &mut a, 3, &mut b, 4, &|i, a, b| {
                pairs.lock().unwrap().push(i);
                a.fill(i + 1);
                b.fill(i + 1);
            });
            // b has two chunks of 4, so a's third chunk of 3 is not visited
            assert_eq!(a, [1, 1, 1, 2, 2, 2, 0, 0, 0]);
            assert_eq!(b, [1, 1, 1, 1, 2, 2, 2, 2]);
            let mut pairs = pairs.into_inner().unwrap();
            pairs.sort();
            assert_eq!(pairs, [0, 1]);
        }
    }

    #[test]
    fn map_keeps_index_order() {
        let squares = on_pool(2, || map(1000, &|i| i * i));
        assert_eq!(squares.len(), 1000);
        assert!(squares.iter().enumerate().all(|(i, &s)| s == i * i));
        assert!(map(0, &|i| i).is_empty());
    }
}
