//! Strided loops on the CPU: the map loops every elementwise kernel is built from, and the
//! copies and casts of a strided view (the leaf kernels the CPU dtype dispatch and every op
//! family read operands through).
//!
//! Inputs are read through their [`Layout`]s (a contiguous input takes a plain slice fast path;
//! in the two- and three-operand maps, a strided or broadcast one with innermost rows of
//! `ROW_MIN` or more is read a row at a time), outputs are written contiguously into a
//! caller-provided slice, parallel over output chunks above
//! [`crate::threads::PARALLEL_THRESHOLD`] elements. Each parallel chunk starts its own
//! [`StridedIndex`] at the chunk's first logical index, so no chunk depends on another. The
//! `*_vectorised` maps compile their dense loop once per instruction set (`simd_dispatch!`),
//! for branch-free functions; the plain ones keep the portable build.

use crate::dtype::Element;
use crate::layout::{Layout, StridedIndex};
use crate::ops::simd::{isa, simd_dispatch};
use crate::threads::PARALLEL_THRESHOLD;

const CHUNK: usize = 1 << 13;

/// Runs `body(start, chunk)` over `out` in chunks, in parallel on kiln's pool above a size.
pub(crate) fn fill_chunks<U: Copy + Send>(out: &mut [U], body: impl Fn(usize, &mut [U]) + Sync) {
    if out.len() > PARALLEL_THRESHOLD {
        fill_chunks_parallel(out, CHUNK, &body);
    } else {
        body(0, out);
    }
}

/// `body(start, chunk)` over `out` in chunks of `chunk_len` elements on kiln's pool: the
/// parallel half of [`fill_chunks`], compiled once per element type rather than once per
/// kernel closure (one `dyn` call per chunk).
pub(crate) fn fill_chunks_parallel<U: Send>(
    out: &mut [U],
    chunk_len: usize,
    body: &(dyn Fn(usize, &mut [U]) + Sync),
) {
    crate::threads::install(|| {
        super::par::chunks_mut(out, chunk_len, &|i, chunk| body(i * chunk_len, chunk))
    });
}

/// Innermost rows at least this long are walked a row at a time ([`row_pieces`]); shorter ones
/// element by element, where a row's setup would cost more than it saves.
const ROW_MIN: usize = 16;

/// The pieces of `[start, start + n)` that each lie in one innermost row of `layout`, as
/// `(at, first, len)`: the chunk's elements `at..at + len` read `src[first + t * step]` for `t`
/// in `0..len`, `step` being the innermost stride (0 for a value broadcast along the row, 1 for
/// a dense row). `None` when the innermost rows are shorter than [`ROW_MIN`].
fn row_pieces(layout: &Layout, start: usize, n: usize) -> Option<(usize, Vec<[usize; 3]>)> {
    let (&inner, outer) = layout.shape().split_last()?;
    let (&step, outer_strides) = layout.strides().split_last()?;
    if inner < ROW_MIN {
        return None;
    }
    let rows = Layout::new(outer.to_vec(), outer_strides.to_vec(), layout.offset());
    let mut row_offsets = StridedIndex::new(&rows, start / inner);
    let (mut at, mut col) = (0, start % inner);
    let mut pieces = Vec::with_capacity(n / inner + 2);
    while at < n {
        let first = row_offsets.next()? + col * step;
        let len = (inner - col).min(n - at);
        pieces.push([at, first, len]);
        at += len;
        col = 0;
    }
    Some((step, pieces))
}

/// `f(x, b[first + t * step])` for the `t`-th `x` of `xs` into `out`: one row piece, with the
/// broadcast and dense rows as plain loops the compiler vectorises.
#[inline(always)]
fn piece2<A: Copy, B: Copy, U>(
    out: &mut [U],
    xs: impl Iterator<Item = A>,
    b: &[B],
    [first, step]: [usize; 2],
    f: impl Fn(A, B) -> U,
) {
    match step {
        0 => {
            let y = b[first];
            out.iter_mut().zip(xs).for_each(|(o, x)| *o = f(x, y));
        }
        1 => {
            let ys = &b[first..first + out.len()];
            out.iter_mut()
                .zip(xs)
                .zip(ys)
                .for_each(|((o, x), &y)| *o = f(x, y));
        }
        _ => out
            .iter_mut()
            .zip(xs)
            .enumerate()
            .for_each(|(t, (o, x))| *o = f(x, b[first + t * step])),
    }
}

/// `f` of every element of `src` viewed through `layout`, as a new `Vec` (the allocating form of
/// [`map1_into`], for tests and callers outside the storage).
pub fn map1<T: Copy + Sync, U: Element>(
    src: &[T],
    layout: &Layout,
    f: impl Fn(T) -> U + Sync,
) -> Vec<U> {
    let mut out = vec![U::zero(); layout.numel()];
    map1_into(src, layout, &mut out, f);
    out
}

/// Writes `f` of every element of `src` viewed through `layout` into `out` (contiguous,
/// `layout.numel()` elements).
pub fn map1_into<T: Copy + Sync, U: Copy + Send>(
    src: &[T],
    layout: &Layout,
    out: &mut [U],
    f: impl Fn(T) -> U + Sync,
) {
    map1_into_on(src, layout, out, &f, |s, o| dense_map1_body(s, o, &f))
}

/// [`map1_into`] with a dense input's loop compiled for this CPU's vector instructions
/// (`simd_dispatch!`): for a branch-free `f` (`activation_math`'s) that the portable build
/// would run two `f64` lanes at a time.
pub fn map1_into_vectorised<T: Copy + Sync, U: Copy + Send>(
    src: &[T],
    layout: &Layout,
    out: &mut [U],
    f: impl Fn(T) -> U + Sync,
) {
    let isa = isa();
    map1_into_on(src, layout, out, &f, |s, o| dense_map1(isa, s, o, &f))
}

/// [`map1_into`]'s walk, with `dense(src, out)` for a contiguous input's chunks (a plain loop,
/// or the dispatched one: only the vectorised maps instantiate a loop per instruction set).
fn map1_into_on<T: Copy + Sync, U: Copy + Send>(
    src: &[T],
    layout: &Layout,
    out: &mut [U],
    f: &(impl Fn(T) -> U + Sync),
    dense: impl Fn(&[T], &mut [U]) + Sync,
) {
    debug_assert_eq!(out.len(), layout.numel());
    let contiguous = layout.contiguous_offset();
    fill_chunks(out, |start, chunk| match contiguous {
        Some(base) => dense(&src[base + start..base + start + chunk.len()], chunk),
        None => {
            for (o, i) in chunk.iter_mut().zip(StridedIndex::new(layout, start)) {
                *o = f(src[i]);
            }
        }
    });
}

simd_dispatch! {
    /// `out[i] = f(src[i])` over two slices of one length.
    pub(crate) fn dense_map1[T: Copy, U: Copy, F: Fn(T) -> U](src: &[T], out: &mut [U], f: &F)
        => dense_map1_body[T, U, F];
}

#[inline(always)]
fn dense_map1_body<T: Copy, U: Copy, F: Fn(T) -> U>(src: &[T], out: &mut [U], f: &F) {
    for (o, &v) in out.iter_mut().zip(src) {
        *o = f(v);
    }
}

simd_dispatch! {
    /// `out[i] = f(a[i], b[i])` over three slices of one length.
    fn dense_map2[A: Copy, B: Copy, U: Copy, F: Fn(A, B) -> U](
        a: &[A],
        b: &[B],
        out: &mut [U],
        f: &F,
    ) => dense_map2_body[A, B, U, F];
}

#[inline(always)]
fn dense_map2_body<A: Copy, B: Copy, U: Copy, F: Fn(A, B) -> U>(
    a: &[A],
    b: &[B],
    out: &mut [U],
    f: &F,
) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = f(x, y);
    }
}

/// Writes `f(a, b)` elementwise over two same-shaped layouts into `out` (contiguous).
pub fn map2<A: Copy + Sync, B: Copy + Sync, U: Copy + Send>(
    a: (&[A], &Layout),
    b: (&[B], &Layout),
    out: &mut [U],
    f: impl Fn(A, B) -> U + Sync,
) {
    map2_on(a, b, out, &f, |x, y, o| dense_map2_body(x, y, o, &f))
}

/// [`map2`] with the loop over two dense operands compiled for this CPU's vector instructions
/// (as [`map1_into_vectorised`]).
pub fn map2_vectorised<A: Copy + Sync, B: Copy + Sync, U: Copy + Send>(
    a: (&[A], &Layout),
    b: (&[B], &Layout),
    out: &mut [U],
    f: impl Fn(A, B) -> U + Sync,
) {
    let isa = isa();
    map2_on(a, b, out, &f, |x, y, o| dense_map2(isa, x, y, o, &f))
}

/// [`map2`]'s walk, with `dense(a, b, out)` for two contiguous operands' chunks (as
/// [`map1_into_on`]).
fn map2_on<A: Copy + Sync, B: Copy + Sync, U: Copy + Send>(
    (a, la): (&[A], &Layout),
    (b, lb): (&[B], &Layout),
    out: &mut [U],
    f: &(impl Fn(A, B) -> U + Sync),
    dense: impl Fn(&[A], &[B], &mut [U]) + Sync,
) {
    debug_assert_eq!(out.len(), la.numel());
    let (ca, cb) = (la.contiguous_offset(), lb.contiguous_offset());
    fill_chunks(out, |start, chunk| {
        let n = chunk.len();
        match (ca, cb) {
            (Some(oa), Some(ob)) => {
                let (sa, sb) = (
                    &a[oa + start..oa + start + n],
                    &b[ob + start..ob + start + n],
                );
                dense(sa, sb, chunk);
            }
            (Some(oa), None) => {
                let sa = &a[oa + start..oa + start + n];
                if let Some((step, pieces)) = row_pieces(lb, start, n) {
                    for [at, first, len] in pieces {
                        let xs = sa[at..at + len].iter().copied();
                        piece2(&mut chunk[at..at + len], xs, b, [first, step], f);
                    }
                    return;
                }
                for ((o, &x), j) in chunk.iter_mut().zip(sa).zip(StridedIndex::new(lb, start)) {
                    *o = f(x, b[j]);
                }
            }
            (None, Some(ob)) => {
                let sb = &b[ob + start..ob + start + n];
                if let Some((step, pieces)) = row_pieces(la, start, n) {
                    for [at, first, len] in pieces {
                        let ys = sb[at..at + len].iter().copied();
                        piece2(&mut chunk[at..at + len], ys, a, [first, step], |y, x| {
                            f(x, y)
                        });
                    }
                    return;
                }
                for ((o, &y), i) in chunk.iter_mut().zip(sb).zip(StridedIndex::new(la, start)) {
                    *o = f(a[i], y);
                }
            }
            _ => {
                let ia = StridedIndex::new(la, start);
                let ib = StridedIndex::new(lb, start);
                for ((o, i), j) in chunk.iter_mut().zip(ia).zip(ib) {
                    *o = f(a[i], b[j]);
                }
            }
        }
    });
}

/// Replaces every element of `dst` (contiguous) by `f(dst, b)`, with `b` read through a layout
/// of `dst`'s shape: the in-place form of [`map2`], each element read and written by one chunk.
pub fn map2_assign<T: Copy + Send + Sync, B: Copy + Sync>(
    dst: &mut [T],
    (b, lb): (&[B], &Layout),
    f: impl Fn(T, B) -> T + Sync,
) {
    debug_assert_eq!(dst.len(), lb.numel());
    // One value broadcast to every element (an in-place op with a scalar): no index walk.
    if lb.strides().iter().all(|&st| st == 0) {
        if let Some(&y) = b.get(lb.offset()) {
            fill_chunks(dst, |_, chunk| chunk.iter_mut().for_each(|o| *o = f(*o, y)));
            return;
        }
    }
    let cb = lb.contiguous_offset();
    fill_chunks(dst, |start, chunk| match cb {
        Some(ob) => {
            let sb = &b[ob + start..ob + start + chunk.len()];
            for (o, &y) in chunk.iter_mut().zip(sb) {
                *o = f(*o, y);
            }
        }
        None => {
            if let Some((step, pieces)) = row_pieces(lb, start, chunk.len()) {
                for [at, first, len] in pieces {
                    let out = &mut chunk[at..at + len];
                    match step {
                        0 => {
                            let y = b[first];
                            out.iter_mut().for_each(|o| *o = f(*o, y));
                        }
                        _ => out
                            .iter_mut()
                            .enumerate()
                            .for_each(|(t, o)| *o = f(*o, b[first + t * step])),
                    }
                }
                return;
            }
            for (o, j) in chunk.iter_mut().zip(StridedIndex::new(lb, start)) {
                *o = f(*o, b[j]);
            }
        }
    });
}

/// Writes `f(a, b, c)` elementwise over three same-shaped layouts into `out` (contiguous).
pub fn map3<A: Copy + Sync, B: Copy + Sync, C: Copy + Sync, U: Copy + Send>(
    (a, la): (&[A], &Layout),
    (b, lb): (&[B], &Layout),
    (c, lc): (&[C], &Layout),
    out: &mut [U],
    f: impl Fn(A, B, C) -> U + Sync,
) {
    debug_assert_eq!(out.len(), la.numel());
    fill_chunks(out, |start, chunk| {
        let n = chunk.len();
        // The three layouts share a shape, so their row pieces cover the same spans.
        if let (Some((sa, pa)), Some((sb, pb)), Some((sc, pc))) = (
            row_pieces(la, start, n),
            row_pieces(lb, start, n),
            row_pieces(lc, start, n),
        ) {
            for (([at, fa, len], [_, fb, _]), [_, fc, _]) in pa.into_iter().zip(pb).zip(pc) {
                for (t, o) in chunk[at..at + len].iter_mut().enumerate() {
                    *o = f(a[fa + t * sa], b[fb + t * sb], c[fc + t * sc]);
                }
            }
            return;
        }
        let ia = StridedIndex::new(la, start);
        let ib = StridedIndex::new(lb, start);
        let ic = StridedIndex::new(lc, start);
        for (((o, i), j), k) in chunk.iter_mut().zip(ia).zip(ib).zip(ic) {
            *o = f(a[i], b[j], c[k]);
        }
    });
}

/// The elements of `layout`, contiguous.
pub fn copy_contiguous<T: Element>(src: &[T], layout: &Layout) -> Vec<T> {
    map1(src, layout, |v: T| v)
}

/// Writes the elements of `layout` contiguously into `out` (`layout.numel()` elements).
pub fn copy_contiguous_into<T: Element>(src: &[T], layout: &Layout, out: &mut [T]) {
    match layout.contiguous_offset() {
        Some(o) => out.copy_from_slice(&src[o..o + out.len()]),
        None => map1_into(src, layout, out, |v: T| v),
    }
}

/// Writes `src` (through `layout`) into `dst` (through `dst_layout`, same shape).
pub fn copy_into<T: Element>(src: &[T], layout: &Layout, dst: &mut [T], dst_layout: &Layout) {
    match (layout.contiguous_offset(), dst_layout.contiguous_offset()) {
        (Some(s), Some(d)) => {
            let n = layout.numel();
            dst[d..d + n].copy_from_slice(&src[s..s + n]);
        }
        _ => {
            for (i, j) in layout.offsets().zip(dst_layout.offsets()) {
                dst[j] = src[i];
            }
        }
    }
}

/// The elements of `layout` converted to `U` (floats to integers truncate toward zero).
pub fn cast<T: Element, U: Element>(src: &[T], layout: &Layout) -> Vec<U> {
    map1(src, layout, |v: T| U::from_f64(v.to_f64()))
}

/// Writes the elements of `layout` converted to `U` into `out` (`layout.numel()` elements).
pub fn cast_into<T: Element, U: Element>(src: &[T], layout: &Layout, out: &mut [U]) {
    map1_into(src, layout, out, |v: T| U::from_f64(v.to_f64()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Source values that name their index exactly in `f32`.
    fn source(layout: &Layout) -> Vec<f32> {
        (0..layout.required_len()).map(|i| i as f32).collect()
    }

    /// What `layout` reads, one element at a time from the first (no chunk starts mid-view).
    fn serial(src: &[f32], layout: &Layout) -> Vec<f32> {
        layout.offsets().map(|i| src[i]).collect()
    }

    /// Views of one `[h, w]` shape, large enough that the loops split them into parallel
    /// chunks, so every chunk after the first starts its strided walk mid-view (and mid-row):
    /// contiguous, a transpose, a narrowed view with an offset, a broadcast row and a broadcast
    /// column (one value along each row: the row walk's innermost stride 0).
    fn views([h, w]: [usize; 2]) -> [Layout; 5] {
        [
            Layout::contiguous(&[h, w]),
            Layout::contiguous(&[w, h]).transpose(0, 1),
            Layout::contiguous(&[h, w + 11]).narrow(1, 5, w),
            Layout::contiguous(&[1, w]).broadcast_to(&[h, w]),
            Layout::contiguous(&[h, 1]).broadcast_to(&[h, w]),
        ]
    }

    /// Rows of 300 take the two-operand maps' row walk; rows of 10 (under `ROW_MIN`) the
    /// element-by-element walk.
    const SHAPES: [[usize; 2]; 2] = [[240, 300], [7200, 10]];

    #[test]
    fn parallel_chunks_of_strided_views_read_what_a_serial_walk_reads() {
        assert!(SHAPES[1][1] < ROW_MIN && SHAPES[0][1] >= ROW_MIN);
        for shape in SHAPES {
            let views = views(shape);
            let n = views[0].numel();
            assert!(
                n > PARALLEL_THRESHOLD,
                "the views must be split into chunks"
            );
            for (v, layout) in views.iter().enumerate() {
                let src = source(layout);
                let want = serial(&src, layout);
                assert_eq!(map1(&src, layout, |x: f32| x), want, "map1, view {v}");
                for (w, other) in views.iter().enumerate() {
                    let src_b = source(other);
                    let pairs: Vec<(f32, f32)> =
                        want.iter().copied().zip(serial(&src_b, other)).collect();
                    let mut out = vec![(0f32, 0f32); n];
                    map2((&src, layout), (&src_b, other), &mut out, |a, b| (a, b));
                    assert_eq!(out, pairs, "map2, {shape:?} views {v} and {w}");
                    let mut dst: Vec<(f32, f32)> = want.iter().map(|&a| (a, f32::NAN)).collect();
                    map2_assign(&mut dst, (&src_b, other), |(a, _), b| (a, b));
                    assert_eq!(dst, pairs, "map2_assign, {shape:?} views {v} and {w}");
                }
            }
            // Three operands with three different innermost strides (rows, 1 and 0).
            let [_, t, narrow, _, column] = &views;
            let (a, b, c) = (source(t), source(narrow), source(column));
            let mut out = vec![(0f32, 0f32, 0f32); n];
            map3((&a, t), (&b, narrow), (&c, column), &mut out, |x, y, z| {
                (x, y, z)
            });
            let want: Vec<(f32, f32, f32)> = (serial(&a, t).into_iter())
                .zip(serial(&b, narrow))
                .zip(serial(&c, column))
                .map(|((x, y), z)| (x, y, z))
                .collect();
            assert_eq!(out, want, "map3, {shape:?}");
        }
    }

    #[test]
    fn the_serial_walk_is_the_views_own_indexing() {
        // The reference above, checked against index arithmetic written out by hand.
        let [_, t, narrow, row, column] = views(SHAPES[0]);
        let (a, b, c) = (source(&t), source(&narrow), source(&row));
        let (ra, rb, rc) = (serial(&a, &t), serial(&b, &narrow), serial(&c, &row));
        let rd = serial(&source(&column), &column);
        for (i, j) in [(0, 0), (0, 299), (1, 0), (131, 17), (239, 299)] {
            let k = i * 300 + j;
            assert_eq!(ra[k], (j * 240 + i) as f32);
            assert_eq!(rb[k], (i * 311 + 5 + j) as f32);
            assert_eq!(rc[k], j as f32);
            assert_eq!(rd[k], i as f32);
        }
    }
}
