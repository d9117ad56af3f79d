//! Layer norm's backward a row at a time, in loops over slices that `simd_dispatch!` compiles
//! for this CPU's vector instructions.
//!
//! Invariants: everything accumulates in `f64` from the saved statistics as stored (`T`); a
//! row's two sums are kept in [`LANES`] partial sums added in lane order, and the parameter
//! gradients' column sums run over rows in order, so every instruction set computes the same
//! bits (no `mul_add`); `xhat` is `(x - mean) · rstd` everywhere it appears.

use crate::ops::simd::simd_dispatch;
use crate::ops::KernelFloat;

/// Partial sums of a row's reductions (an AVX-512 register of `f64`s).
const LANES: usize = 8;

/// One row's input gradient: `rstd (g - mean(g) - xhat mean(g xhat))` with `g = dy w`, where
/// `w` holds the row's weights (ones when the norm has none).
#[inline(always)]
fn input_grad_body<T: KernelFloat>(
    dy: &[T],
    x: &[T],
    w: &[T],
    [mean, rstd]: [f64; 2],
    gin: &mut [T],
) {
    let n = dy.len();
    let (mut sum_g, mut sum_gx) = ([0.0f64; LANES], [0.0f64; LANES]);
    let whole = n - n % LANES;
    let (dy_l, x_l, w_l) = (&dy[..whole], &x[..whole], &w[..whole]);
    let lanes = dy_l.chunks_exact(LANES).zip(x_l.chunks_exact(LANES));
    for ((d, xs), ws) in lanes.zip(w_l.chunks_exact(LANES)) {
        for l in 0..LANES {
            let g = d[l].to_f64() * ws[l].to_f64();
            sum_g[l] += g;
            sum_gx[l] += g * ((xs[l].to_f64() - mean) * rstd);
        }
    }
    for (l, j) in (whole..n).enumerate() {
        let g = dy[j].to_f64() * w[j].to_f64();
        sum_g[l] += g;
        sum_gx[l] += g * ((x[j].to_f64() - mean) * rstd);
    }
    let total = |s: [f64; LANES]| s.iter().fold(0.0, |acc, &v| acc + v) / n as f64;
    let (mean_g, mean_gx) = (total(sum_g), total(sum_gx));
    for (((o, d), xv), wv) in gin.iter_mut().zip(dy).zip(x).zip(w) {
        let g = d.to_f64() * wv.to_f64();
        let xhat = (xv.to_f64() - mean) * rstd;
        *o = T::from_f64(rstd * (g - mean_g - xhat * mean_gx));
    }
}

simd_dispatch! {
    /// One row's input gradient (see [`input_grad_body`]).
    pub(super) fn input_grad_row[T: KernelFloat](
        dy: &[T],
        x: &[T],
        w: &[T],
        stats: [f64; 2],
        gin: &mut [T],
    ) => input_grad_body[T];
}

/// Adds one block of rows' `Σ dy · xhat` (into `acc[..cols]`, the weight's gradient) and `Σ dy`
/// (into `acc[cols..]`, the bias's) column by column, the rows in order; `stats` holds each
/// row's saved `(mean, rstd)`.
#[inline(always)]
fn param_grads_body<T: KernelFloat>(dy: &[T], x: &[T], stats: &[[f64; 2]], acc: &mut [f64]) {
    let cols = acc.len() / 2;
    let (acc_w, acc_b) = acc.split_at_mut(cols);
    for ((d, xs), &[mean, rstd]) in dy.chunks_exact(cols).zip(x.chunks_exact(cols)).zip(stats) {
        for (((aw, ab), dv), xv) in acc_w.iter_mut().zip(acc_b.iter_mut()).zip(d).zip(xs) {
            let dv = dv.to_f64();
            *aw += dv * ((xv.to_f64() - mean) * rstd);
            *ab += dv;
        }
    }
}

simd_dispatch! {
    /// One block of rows' parameter-gradient sums (see [`param_grads_body`]).
    pub(super) fn param_grads_rows[T: KernelFloat](
        dy: &[T],
        x: &[T],
        stats: &[[f64; 2]],
        acc: &mut [f64],
    ) => param_grads_body[T];
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::simd::available;

    /// A row of 203 (25 whole lane groups and a tail of 3) and its statistics.
    fn row() -> (Vec<f32>, Vec<f32>, Vec<f32>, [f64; 2]) {
        let n = 203;
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 37) % 29) as f32 * 0.25 - 3.0)
            .collect();
        let dy: Vec<f32> = (0..n)
            .map(|i| ((i * 11) % 17) as f32 * 0.125 - 1.0)
            .collect();
        let w: Vec<f32> = (0..n).map(|i| 0.5 + (i % 5) as f32 * 0.25).collect();
        let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
        let var = x
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n as f64;
        (x, dy, w, [mean, 1.0 / (var + 1e-5).sqrt()])
    }

    #[test]
    fn input_gradient_matches_the_formula_on_every_instruction_set() {
        let (x, dy, w, [mean, rstd]) = row();
        let n = x.len() as f64;
        let g: Vec<f64> = dy.iter().zip(&w).map(|(&d, &w)| f64::from(d * w)).collect();
        let xhat: Vec<f64> = x.iter().map(|&v| (f64::from(v) - mean) * rstd).collect();
        let mean_g = g.iter().sum::<f64>() / n;
        let mean_gx = g.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / n;
        let mut portable = vec![0.0f32; x.len()];
        input_grad_body(&dy, &x, &w, [mean, rstd], &mut portable);
        for (j, &got) in portable.iter().enumerate() {
            let want = rstd * (g[j] - mean_g - xhat[j] * mean_gx);
            assert!(
                (f64::from(got) - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "{j}"
            );
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for isa in available().into_iter().map(Some) {
            let mut got = vec![0.0f32; x.len()];
            input_grad_row(isa, &dy, &x, &w, [mean, rstd], &mut got);
            assert_eq!(bits(&got), bits(&portable), "{isa:?}");
        }
    }

    #[test]
    fn parameter_gradients_sum_each_column_over_the_rows() {
        let (x, dy, _, [mean, rstd]) = row();
        // The 203 values as 7 rows of 29, sharing one mean and rstd for the check.
        let stats = [[mean, rstd]; 7];
        let mut portable = vec![0.0; 58];
        param_grads_body(&dy, &x, &stats, &mut portable);
        for c in 0..29 {
            let col = (0..7).map(|r| r * 29 + c);
            let gw: f64 = col
                .clone()
                .map(|i| f64::from(dy[i]) * ((f64::from(x[i]) - mean) * rstd))
                .sum();
            let gb: f64 = col.map(|i| f64::from(dy[i])).sum();
            assert_eq!((portable[c], portable[29 + c]), (gw, gb), "column {c}");
        }
        for isa in available().into_iter().map(Some) {
            let mut got = vec![0.0; 58];
            param_grads_rows(isa, &dy, &x, &stats, &mut got);
            assert_eq!(got, portable, "{isa:?}");
        }
    }
}
