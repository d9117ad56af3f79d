//! CPU top-k: each row copied out, partially selected (`select_nth_unstable_by`) down to its
//! best `k`, and those sorted, under the total order of the family's notes (NaN above every
//! number, ties by position); rows split across the pool.

use super::{rows_and_len, TopkOps};
use crate::dtype::Element;
use crate::layout::Layout;
use crate::ops::cpu_dispatch::output;
use crate::ops::strided::copy_contiguous_into;
use crate::storage::with_slice;
use crate::threads::PARALLEL_THRESHOLD;
use crate::{CpuStorage, Result};
use std::cmp::Ordering;

/// `a` against `b` in the family's order: NaN above every number, then by value.
#[allow(clippy::eq_op)]
fn value_order<T: Element>(a: T, b: T) -> Ordering {
    match (a != a, b != b) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

/// The top-`k` of one row: `values` and `indices` hold `k` slots.
fn row_top_k<T: Element>(row: &[T], largest: bool, values: &mut [T], indices: &mut [i64]) {
    let k = values.len();
    if k == 0 {
        return;
    }
    let better = |&a: &usize, &b: &usize| {
        let by_value = value_order(row[a], row[b]);
        let by_value = if largest {
            by_value.reverse()
        } else {
            by_value
        };
        by_value.then(a.cmp(&b))
    };
    let mut order: Vec<usize> = (0..row.len()).collect();
    if k < order.len() {
        order.select_nth_unstable_by(k - 1, better);
        order.truncate(k);
    }
    order.sort_unstable_by(better);
    for ((slot, index), &i) in values.iter_mut().zip(indices.iter_mut()).zip(&order) {
        *slot = row[i];
        *index = i as i64;
    }
}

/// The top-`k` of every row of the last dim of `layout` over `src`, written contiguously into
/// `values` and `indices` (`rows * k` slots each).
pub fn top_k_into<T: Element>(
    src: &[T],
    layout: &Layout,
    k: usize,
    largest: bool,
    values: &mut [T],
    indices: &mut [i64],
) {
    let d = layout.shape().last().copied().unwrap_or(1);
    if k == 0 || d == 0 || layout.numel() == 0 {
        return;
    }
    let mut dense = vec![src[0]; layout.numel()];
    copy_contiguous_into(src, layout, &mut dense);
    let one = |r: usize, vals: &mut [T], idx: &mut [i64]| {
        row_top_k(&dense[r * d..][..d], largest, vals, idx)
    };
    // parallel on the input's size: each row reads `d` elements to write `k`
    let parallel = dense.len() > PARALLEL_THRESHOLD;
    crate::ops::par::chunks_mut_pair_if(parallel, values, k, indices, k, &one);
}

impl TopkOps for CpuStorage {
    fn topk_last_dim(&self, layout: &Layout, k: usize, largest: bool) -> Result<(Self, Self)> {
        let (rows, _) = rows_and_len(layout, k, self.dtype())?;
        let n = rows * k;
        let mut values = None;
        let indices = output::<i64>(n, |idx| {
            values = Some(with_slice!(self, s => output(n, |vals| {
                top_k_into(s, layout, k, largest, vals, idx)
            })));
        })?;
        let values = values.expect("the index output's writer ran")?;
        Ok((values, indices))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_rank_nan_first_and_ties_by_position() {
        let x = [1.0f32, f32::NAN, 3.0, 3.0, -2.0, 0.5, 0.5, 0.5];
        let l = Layout::contiguous(&[2, 4]);
        let (mut v, mut i) = ([0.0f32; 4], [0i64; 4]);
        top_k_into(&x, &l, 2, true, &mut v, &mut i);
        assert_eq!(i, [1, 2, 1, 2]);
        assert!(v[0].is_nan());
        assert_eq!(v[1..], [3.0, 0.5, 0.5]);
        top_k_into(&x, &l, 2, false, &mut v, &mut i);
        assert_eq!((v, i), ([1.0, 3.0, -2.0, 0.5], [0, 2, 0, 1]));
    }

    #[test]
    fn every_row_of_a_parallel_top_k_matches_a_sorted_row() {
        // Enough rows that the pool splits them; values repeat, so ties are ranked by position.
        let (rows, d, k) = (1100, 37, 5);
        assert!(
            rows * d > PARALLEL_THRESHOLD,
            "the rows must run in parallel"
        );
        let x: Vec<f32> = (0..rows * d).map(|i| ((i * 7919) % 53) as f32).collect();
        let l = Layout::contiguous(&[rows, d]);
        let (mut v, mut idx) = (vec![0f32; rows * k], vec![0i64; rows * k]);
        for largest in [true, false] {
            top_k_into(&x, &l, k, largest, &mut v, &mut idx);
            for r in 0..rows {
                let row = &x[r * d..(r + 1) * d];
                let mut order: Vec<usize> = (0..d).collect();
                // A stable sort keeps equal values in position order.
                order.sort_by(|&a, &b| {
                    let o = row[a].partial_cmp(&row[b]).unwrap();
                    if largest {
                        o.reverse()
                    } else {
                        o
                    }
                });
                let want_i: Vec<i64> = order[..k].iter().map(|&j| j as i64).collect();
                let want_v: Vec<f32> = order[..k].iter().map(|&j| row[j]).collect();
                assert_eq!(
                    idx[r * k..(r + 1) * k],
                    want_i,
                    "row {r}, largest {largest}"
                );
                assert_eq!(v[r * k..(r + 1) * k], want_v, "row {r}, largest {largest}");
            }
        }
    }
}
