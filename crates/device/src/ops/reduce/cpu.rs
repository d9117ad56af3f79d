//! CPU reductions. The input layout is permuted so the kept dims come first and the reduced dims
//! last; output element `o` then folds the `R` consecutive logical elements `o*R .. (o+1)*R` of
//! the permuted layout, in that order. A dense input reduced over its leading dims (a bias
//! gradient) is walked a row at a time over tiles of columns instead, each output folding its
//! elements in the same order. Outputs are independent, so they are split across the pool.
//! Floats accumulate in `f64` (more accurate than PyTorch's f32 cascade sum, never less),
//! integers in `i64`.
//!
//! The `*_into` kernels write into a caller-provided slice of [`reduced_len`] elements (the CPU
//! storage passes a block of the caching allocator); the plain forms return a new `Vec`.

use super::{ReduceOp, ReduceOps};
use crate::dtype::Element;
use crate::layout::{Layout, StridedIndex};
use crate::ops::cpu_dispatch::output;
use crate::storage::with_slice;
use crate::threads::PARALLEL_THRESHOLD;
use crate::{CpuStorage, Result};

/// The permuted layout (kept dims, then reduced dims) and the reduced element count `R`.
fn kept_then_reduced(layout: &Layout, dims: &[usize]) -> (Layout, usize) {
    let mut perm: Vec<usize> = (0..layout.rank()).filter(|d| !dims.contains(d)).collect();
    perm.extend_from_slice(dims);
    let r = dims.iter().map(|&d| layout.shape()[d]).product();
    (layout.permute(&perm), r)
}

/// Number of outputs of reducing `dims` of `layout` (the product of the kept dims).
pub fn reduced_len(layout: &Layout, dims: &[usize]) -> usize {
    layout.numel_kept(dims)
}

/// Folds each group of `R` elements into one output with `fold`, starting from `init`, writing
/// output `o` to `out[o]` (`out` holds [`reduced_len`] elements).
pub fn fold_groups<T: Element, A: Copy + Send + Sync, U: Element>(
    src: &[T],
    layout: &Layout,
    dims: &[usize],
    init: A,
    fold: impl Fn(A, usize, T) -> A + Sync,
    finish: impl Fn(A) -> U + Sync,
    out: &mut [U],
) {
    if let Some(leading) = LeadingDims::of(layout, dims) {
        return fold_leading(src, leading, init, fold, finish, out);
    }
    let (perm, r) = kept_then_reduced(layout, dims);
    let n_out = out.len();
    debug_assert_eq!(n_out, reduced_len(layout, dims));
    // Reducing the trailing dims of a dense layout: each group is a plain slice.
    let dense = perm.contiguous_offset();
    let body = |o: usize, slot: &mut U| {
        let mut acc = init;
        if let (Some(base), true) = (dense, r > 0) {
            for (j, &v) in src[base + o * r..base + (o + 1) * r].iter().enumerate() {
                acc = fold(acc, j, v);
            }
        } else if r > 0 {
            for (j, i) in StridedIndex::new(&perm, o * r).take(r).enumerate() {
                acc = fold(acc, j, src[i]);
            }
        }
        *slot = finish(acc);
    };
    let run = |first: usize, slots: &mut [U]| {
        for (o, slot) in (first..).zip(slots) {
            body(o, slot);
        }
    };
    if perm.numel() > PARALLEL_THRESHOLD && n_out > 1 {
        // Blocks of outputs that read about `BLOCK_ELEMENTS` source elements each (one `dyn`
        // call per block), at least one output per block.
        let block = (BLOCK_ELEMENTS / r.max(1)).max(1);
        crate::ops::strided::fill_chunks_parallel(out, block, &run);
    } else {
        run(0, out);
    }
}

/// About how many source elements one parallel block of [`fold_groups`]'s outputs reads.
const BLOCK_ELEMENTS: usize = 1 << 13;

/// A dense source whose reduced dims are its leading ones (`dims` is `0..p`, in order): a bias
/// gradient's sum over batch and positions. Seen as `rows x cols` (`rows` the reduced count),
/// output `c` folds column `c`; [`fold_leading`] walks it a row at a time.
#[derive(Clone, Copy)]
struct LeadingDims {
    base: usize,
    rows: usize,
    cols: usize,
}

impl LeadingDims {
    fn of(layout: &Layout, dims: &[usize]) -> Option<LeadingDims> {
        let base = layout.contiguous_offset()?;
        let leading = dims.iter().enumerate().all(|(i, &d)| d == i);
        // Reducing every dim makes one dense group: the plain slice path's case.
        if dims.is_empty() || dims.len() >= layout.rank() || !leading {
            return None;
        }
        let shape = layout.shape();
        Some(LeadingDims {
            base,
            rows: shape[..dims.len()].iter().product(),
            cols: shape[dims.len()..].iter().product(),
        })
    }
}

/// Columns one tile of [`fold_leading`] folds at once (its accumulators stay in registers or
/// the first cache level while it walks every row).
const TILE: usize = 64;

/// [`fold_groups`] over [`LeadingDims`]: tiles of [`TILE`] columns, each walking every row's
/// piece of the tile in order, so each column is read contiguously across the tile and folds
/// its elements in the same order (row `j` as position `j`) as the element walk would.
fn fold_leading<T: Element, A: Copy + Send + Sync, U: Element>(
    src: &[T],
    m: LeadingDims,
    init: A,
    fold: impl Fn(A, usize, T) -> A + Sync,
    finish: impl Fn(A) -> U + Sync,
    out: &mut [U],
) {
    debug_assert_eq!(out.len(), m.cols);
    let tiles = |first: usize, slots: &mut [U]| {
        for (t, tile) in slots.chunks_mut(TILE).enumerate() {
            let col = first + t * TILE;
            let mut acc = [init; TILE];
            for j in 0..m.rows {
                let at = m.base + j * m.cols + col;
                for (a, &v) in acc.iter_mut().zip(&src[at..at + tile.len()]) {
                    *a = fold(*a, j, v);
                }
            }
            for (slot, &a) in tile.iter_mut().zip(&acc) {
                *slot = finish(a);
            }
        }
    };
    if m.rows.saturating_mul(m.cols) > PARALLEL_THRESHOLD && m.cols > TILE {
        // Whole tiles per block, about `BLOCK_ELEMENTS` source elements each.
        let block = (BLOCK_ELEMENTS / m.rows.max(1)).div_ceil(TILE).max(1) * TILE;
        crate::ops::strided::fill_chunks_parallel(out, block, &tiles);
    } else {
        tiles(0, out);
    }
}

/// The allocating form of a `*_into` reduction.
fn collect<U: Element>(layout: &Layout, dims: &[usize], into: impl FnOnce(&mut [U])) -> Vec<U> {
    let mut out = vec![U::zero(); reduced_len(layout, dims)];
    into(&mut out);
    out
}

trait KeptNumel {
    fn numel_kept(&self, dims: &[usize]) -> usize;
}

impl KeptNumel for Layout {
    fn numel_kept(&self, dims: &[usize]) -> usize {
        (0..self.rank())
            .filter(|d| !dims.contains(d))
            .map(|d| self.shape()[d])
            .product()
    }
}

/// Float sum (f64 accumulator).
pub fn sum_float<T: Element>(src: &[T], layout: &Layout, dims: &[usize]) -> Vec<T> {
    collect(layout, dims, |out| sum_float_into(src, layout, dims, out))
}

/// Float sum (f64 accumulator) into `out`.
pub fn sum_float_into<T: Element>(src: &[T], layout: &Layout, dims: &[usize], out: &mut [T]) {
    fold_groups(
        src,
        layout,
        dims,
        0.0f64,
        |a, _, v: T| a + v.to_f64(),
        T::from_f64,
        out,
    )
}

/// Integer / bool sum into `i64`.
pub fn sum_int<T: Element>(src: &[T], layout: &Layout, dims: &[usize]) -> Vec<i64> {
    collect(layout, dims, |out| sum_int_into(src, layout, dims, out))
}

/// Integer / bool sum into the `i64` slice `out`.
pub fn sum_int_into<T: Element>(src: &[T], layout: &Layout, dims: &[usize], out: &mut [i64]) {
    fold_groups(
        src,
        layout,
        dims,
        0i64,
        |a, _, v: T| a.wrapping_add(v.to_f64() as i64),
        |a| a,
        out,
    )
}

/// Max (`largest = true`) or min, NaN-propagating for floats. Empty groups give NaN / 0.
pub fn extreme<T: Element>(src: &[T], layout: &Layout, dims: &[usize], largest: bool) -> Vec<T> {
    collect(layout, dims, |out| {
        extreme_into(src, layout, dims, largest, out)
    })
}

/// [`extreme`] into `out`.
pub fn extreme_into<T: Element>(
    src: &[T],
    layout: &Layout,
    dims: &[usize],
    largest: bool,
    out: &mut [T],
) {
    fold_groups(
        src,
        layout,
        dims,
        None::<T>,
        move |acc, _, v: T| match acc {
            None => Some(v),
            #[allow(clippy::eq_op)]
            Some(a) if a != a => Some(a),
            #[allow(clippy::eq_op)]
            Some(_) if v != v => Some(v),
            Some(a) => Some(if (largest && v > a) || (!largest && v < a) {
                v
            } else {
                a
            }),
        },
        |acc| acc.unwrap_or_else(|| T::from_f64(f64::NAN)),
        out,
    )
}

/// Index of the first max / min along the reduced dims (NaN counts as the extreme, as in PyTorch).
pub fn arg_extreme<T: Element>(
    src: &[T],
    layout: &Layout,
    dims: &[usize],
    largest: bool,
) -> Vec<i64> {
    collect(layout, dims, |out| {
        arg_extreme_into(src, layout, dims, largest, out)
    })
}

/// [`arg_extreme`] into `out`.
pub fn arg_extreme_into<T: Element>(
    src: &[T],
    layout: &Layout,
    dims: &[usize],
    largest: bool,
    out: &mut [i64],
) {
    fold_groups(
        src,
        layout,
        dims,
        None::<(usize, T)>,
        move |acc, j, v: T| match acc {
            None => Some((j, v)),
            #[allow(clippy::eq_op)]
            Some((i, a)) if a != a => Some((i, a)),
            #[allow(clippy::eq_op)]
            Some(_) if v != v => Some((j, v)),
            Some((i, a)) => Some(if (largest && v > a) || (!largest && v < a) {
                (j, v)
            } else {
                (i, a)
            }),
        },
        |acc| acc.map(|(i, _)| i as i64).unwrap_or(0),
        out,
    )
}

impl ReduceOps for CpuStorage {
    fn reduce(&self, layout: &Layout, dims: &[usize], op: ReduceOp) -> Result<Self> {
        let n = reduced_len(layout, dims);
        match op {
            ReduceOp::Sum => match self {
                CpuStorage::F32(b) => output(n, |o| sum_float_into(b.as_slice(), layout, dims, o)),
                CpuStorage::F64(b) => output(n, |o| sum_float_into(b.as_slice(), layout, dims, o)),
                CpuStorage::F16(b) => output(n, |o| sum_float_into(b.as_slice(), layout, dims, o)),
                CpuStorage::BF16(b) => output(n, |o| sum_float_into(b.as_slice(), layout, dims, o)),
                other => {
                    with_slice!(other, s => output::<i64>(n, |o| sum_int_into(s, layout, dims, o)))
                }
            },
            ReduceOp::Max => {
                with_slice!(self, s => output(n, |o| extreme_into(s, layout, dims, true, o)))
            }
            ReduceOp::Min => {
                with_slice!(self, s => output(n, |o| extreme_into(s, layout, dims, false, o)))
            }
            ReduceOp::ArgMax => {
                with_slice!(self, s => output::<i64>(n, |o| arg_extreme_into(s, layout, dims, true, o)))
            }
            ReduceOp::ArgMin => {
                with_slice!(self, s => output::<i64>(n, |o| arg_extreme_into(s, layout, dims, false, o)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_over_middle_dim() {
        let x: Vec<f32> = (0..24).map(|v| v as f32).collect();
        let l = Layout::contiguous(&[2, 3, 4]);
        let s = sum_float(&x, &l, &[1]);
        assert_eq!(s[..4], [12.0, 15.0, 18.0, 21.0]);
        assert_eq!(arg_extreme(&x, &l, &[2], true), vec![3; 6]);
        assert_eq!(extreme(&x, &l, &[0, 2], false), vec![0.0, 4.0, 8.0]);
        // trailing dims of a dense layout (slice path) and of a transposed one (strided path)
        assert_eq!(sum_float(&x, &l, &[1, 2]), vec![66.0, 210.0]);
        let t = l.permute(&[2, 1, 0]);
        assert_eq!(sum_float(&x, &t, &[2])[..3], [12.0, 20.0, 28.0]);
    }

    #[test]
    fn large_whole_sums_split_into_exact_partials() {
        let n = 1 << 17;
        let x: Vec<f32> = (0..n).map(|v| (v % 7) as f32).collect();
        let want: f64 = x.iter().map(|&v| v as f64).sum();
        assert_eq!(
            sum_float(&x, &Layout::contiguous(&[n]), &[0]),
            vec![want as f32]
        );
        let grid = Layout::contiguous(&[n / 4, 4]);
        assert_eq!(sum_float(&x, &grid, &[0, 1]), vec![want as f32]);
        assert_eq!(sum_float(&x, &grid, &[1])[..2], [6.0, 15.0]);
    }

    /// The parallel path hands out blocks of outputs; every output, in full and partial blocks,
    /// on the slice path (rows of 200: blocks of 40 rows over 300), the leading-dims path
    /// (columns of 300: blocks of 64 columns over 200, the last one 8 wide) and the strided one
    /// (the same columns read through a transpose: blocks of 27 columns), equals its plain sum.
    #[test]
    fn parallel_blocks_of_outputs_write_every_output() {
        let (rows, cols) = (300, 200);
        // Sums stay exact in f32; no two rows (or columns) a block apart share a sum.
        let x: Vec<f32> = (0..rows * cols).map(|v| (v % 1009) as f32).collect();
        let l = Layout::contiguous(&[rows, cols]);
        let row_sums: Vec<f32> = x.chunks(cols).map(|r| r.iter().sum()).collect();
        assert_eq!(sum_float(&x, &l, &[1]), row_sums);
        let col_sums: Vec<f32> = (0..cols)
            .map(|c| (0..rows).map(|r| x[r * cols + c]).sum())
            .collect();
        assert_eq!(sum_float(&x, &l, &[0]), col_sums);
        // The same data stored column-major: a strided view of the same logical matrix.
        let stored: Vec<f32> = (0..cols)
            .flat_map(|c| (0..rows).map(move |r| (r, c)))
            .map(|(r, c)| x[r * cols + c])
            .collect();
        let transposed = Layout::contiguous(&[cols, rows]).permute(&[1, 0]);
        assert_eq!(sum_float(&stored, &transposed, &[0]), col_sums);
    }

    /// Reducing leading dims folds each column in row order, position by position: arg-max's
    /// positions, a three-dim source reduced over two, and an offset view; reducing every dim
    /// keeps the plain slice path.
    #[test]
    fn leading_dims_fold_columns_in_row_order() {
        let (b, t, d) = (3, 5, 70);
        let x: Vec<f32> = (0..b * t * d).map(|v| ((v * 37) % 101) as f32).collect();
        let l = Layout::contiguous(&[b, t, d]);
        let want_sum: Vec<f32> = (0..d)
            .map(|c| (0..b * t).map(|r| x[r * d + c]).sum())
            .collect();
        assert_eq!(sum_float(&x, &l, &[0, 1]), want_sum);
        let want_arg: Vec<i64> = (0..d)
            .map(|c| {
                let col: Vec<f32> = (0..b * t).map(|r| x[r * d + c]).collect();
                let best = col.iter().cloned().fold(f32::MIN, f32::max);
                col.iter().position(|&v| v == best).unwrap() as i64
            })
            .collect();
        let flat = Layout::contiguous(&[b * t, d]);
        assert_eq!(arg_extreme(&x, &flat, &[0], true), want_arg);
        // Not leading in order: the element walk, same sums.
        assert_eq!(sum_float(&x, &l, &[1, 0]), want_sum);
        // A view starting one row in.
        let view = flat.narrow(0, 1, b * t - 1);
        let tail: Vec<f32> = (0..d)
            .map(|c| (1..b * t).map(|r| x[r * d + c]).sum())
            .collect();
        assert_eq!(sum_float(&x, &view, &[0]), tail);
        assert!(LeadingDims::of(&l, &[0, 1, 2]).is_none());
        assert!(LeadingDims::of(&l, &[1]).is_none());
    }
}
