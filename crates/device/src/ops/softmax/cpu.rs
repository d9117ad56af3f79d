//! CPU softmax over rows of the last dim, rows split across the pool, each row in vectorised
//! passes (maximum, exponentials and their sum, scale) built for every instruction set.

use super::SoftmaxOps;
use crate::layout::Layout;
use crate::ops::cpu_dispatch::float_op;
use crate::ops::exp_math::exp_nonpositive;
use crate::ops::simd::{isa, simd_dispatch};
use crate::ops::strided::copy_contiguous_into;
use crate::ops::KernelFloat;
use crate::threads::PARALLEL_THRESHOLD;
use crate::{CpuStorage, Result};

/// Independent accumulators of a row's maximum and sum (the order of the reduction is fixed,
/// so every instruction set gives the same bits).
const LANES: usize = 8;

/// The larger of `m` and `v`, NaN winning (a row holding a NaN is NaN throughout).
#[inline(always)]
fn larger<F: KernelFloat>(m: F, v: F) -> F {
    if v > m || v.is_nan() {
        v
    } else {
        m
    }
}

/// One row in place: its maximum, then `e = exp(v - max)` (in `f64`, `exp_math`'s vectorisable
/// exp, summed in `f64`), then `v - max - ln(sum)` (log) or `e / sum`. Softmax keeps each `e`
/// in the row between the passes, rounded to `F` (one exp per element, as PyTorch's kernel).
#[inline(always)]
fn row_body<F: KernelFloat>(r: &mut [F], log: bool) {
    let mut lanes = [r[0]; LANES];
    let chunks = r.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = larger(*m, v);
        }
    }
    for (m, &v) in lanes.iter_mut().zip(tail) {
        *m = larger(*m, v);
    }
    let max = lanes.into_iter().fold(r[0], larger);
    let m = max.to_f64();
    let mut sums = [0.0f64; LANES];
    let exp = |v: F| exp_nonpositive(v.to_f64() - m);
    let mut chunks = r.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for (s, v) in sums.iter_mut().zip(c) {
            let e = exp(*v);
            *s += e;
            if !log {
                *v = F::from_f64(e);
            }
        }
    }
    for (s, v) in sums.iter_mut().zip(chunks.into_remainder()) {
        let e = exp(*v);
        *s += e;
        if !log {
            *v = F::from_f64(e);
        }
    }
    let sum = sums.into_iter().fold(0.0, |a, b| a + b);
    if log {
        let lse = F::c(sum.ln());
        r.iter_mut().for_each(|v| *v = *v - max - lse);
    } else {
        let inv = F::c(1.0 / sum);
        r.iter_mut().for_each(|v| *v *= inv);
    }
}

simd_dispatch! {
    /// One row of [`softmax_last_dim`], built for the instruction set `isa`.
    fn softmax_row[F: KernelFloat](r: &mut [F], log: bool) => row_body[F];
}

/// Softmax (`log = false`) or log-softmax over the last dim of `layout`, written contiguously
/// into `out` (`layout.numel()` elements).
pub fn softmax_last_dim<F: KernelFloat>(src: &[F], layout: &Layout, log: bool, out: &mut [F]) {
    let d = layout.shape().last().copied().unwrap_or(1);
    copy_contiguous_into(src, layout, out);
    if d == 0 {
        return;
    }
    let chosen = isa();
    let row = |_: usize, r: &mut [F]| softmax_row(chosen, r, log);
    let parallel = out.len() > PARALLEL_THRESHOLD;
    crate::ops::par::chunks_mut_if(parallel, out, d, &row);
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

    /// Rows with a tail after the lanes, masked (-inf) entries and a NaN: every instruction
    /// set gives the portable build's bits, and the special values keep PyTorch's meaning.
    #[test]
    fn every_instruction_set_gives_the_portable_bits() {
        let mut row: Vec<f32> = (0..203)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * if i % 7 == 0 { 9.0 } else { 0.2 })
            .collect();
        row[11] = f32::NEG_INFINITY;
        for log in [false, true] {
            let mut portable = row.clone();
            row_body(&mut portable, log);
            assert_eq!(portable[11], if log { f32::NEG_INFINITY } else { 0.0 });
            for isa in crate::ops::simd::available().into_iter().map(Some) {
                let mut got = row.clone();
                softmax_row(isa, &mut got, log);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&portable), "{isa:?}, log {log}");
            }
        }
        let mut nan = row.clone();
        nan[150] = f32::NAN;
        row_body(&mut nan, false);
        assert!(nan.iter().all(|v| v.is_nan()));
    }

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
