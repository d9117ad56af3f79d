//! CPU softmax over rows of the last dim, rows split across the pool.

use super::SoftmaxOps;
use crate::layout::Layout;
use crate::ops::cpu_dispatch::float_op;
use crate::ops::strided::copy_contiguous_into;
use crate::ops::KernelFloat;
use crate::threads::PARALLEL_THRESHOLD;
use crate::{CpuStorage, Result};
use rayon::prelude::*;

/// Softmax (`log = false`) or log-softmax over the last dim of `layout`, written contiguously
/// into `out` (`layout.numel()` elements).
pub fn softmax_last_dim<F: KernelFloat>(src: &[F], layout: &Layout, log: bool, out: &mut [F]) {
    let d = layout.shape().last().copied().unwrap_or(1);
    copy_contiguous_into(src, layout, out);
    if d == 0 {
        return;
    }
    let row = |r: &mut [F]| {
        let mut max = r[0];
        for &v in r.iter() {
            if v > max || v.is_nan() {
                max = v;
            }
        }
        let mut sum = 0.0f64;
        for &v in r.iter() {
            sum += (v - max).exp().to_f64();
        }
        if log {
            let lse = F::c(sum.ln());
            r.iter_mut().for_each(|v| *v = *v - max - lse);
        } else {
            let inv = F::c(1.0 / sum);
            r.iter_mut().for_each(|v| *v = (*v - max).exp() * inv);
        }
    };
    if out.len() > PARALLEL_THRESHOLD {
        crate::threads::install(|| out.par_chunks_mut(d).for_each(row));
    } else {
        out.chunks_mut(d).for_each(row);
    }
}

impl SoftmaxOps for CpuStorage {
    fn softmax_last_dim(&self, layout: &Layout, log: bool) -> Result<Self> {
        float_op!(self, layout, "softmax", |s, l, out| {
            softmax_last_dim(s, l, log, out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_of_a_parallel_softmax_is_normalised_against_an_f64_reference() {
        // Enough rows that the pool splits them; the rows are read through a transpose.
        let (rows, d) = (1201, 37);
        assert!(
            rows * d > PARALLEL_THRESHOLD,
            "the rows must run in parallel"
        );
        let layout = Layout::contiguous(&[d, rows]).transpose(0, 1);
        let src: Vec<f32> = (0..rows * d)
            .map(|i| ((i * 7919) % 101) as f32 * 0.1 - 5.0)
            .collect();
        for log in [false, true] {
            let mut out = vec![f32::NAN; rows * d];
            softmax_last_dim(&src, &layout, log, &mut out);
            for r in 0..rows {
                let x: Vec<f64> = (0..d).map(|j| f64::from(src[j * rows + r])).collect();
                let max = x.iter().cloned().fold(f64::MIN, f64::max);
                let lse = max + x.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
                for (j, &v) in x.iter().enumerate() {
                    let want = if log { v - lse } else { (v - lse).exp() };
                    let got = f64::from(out[r * d + j]);
                    assert!(
                        (got - want).abs() <= 1e-5,
                        "row {r}, col {j}, log {log}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
