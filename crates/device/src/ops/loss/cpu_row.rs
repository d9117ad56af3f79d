//! CPU cross-entropy of one row of plain `[N, C]` logits (`D = 1`): a classifier's or a
//! language model's head, where a row holds every class contiguously.
//!
//! Invariants: the statistics are those of the module docs of [`super`], in `f64`: the row's
//! maximum (a NaN logit is skipped by the maximum and reaches the sum), the sum of
//! `exp(z - max)` over the logits that are not `-inf`, `S = Σ q w` and the shifted sum
//! `Σ q w (z - max)`, then the loss `S ln(sum) - shifted` and the gradient
//! `exp((z - max) - ln(sum)) S - q w`, each rounded to `T` once. The row is read in three
//! passes (maximum, sum of exponentials, gradient; a row of a 32k vocabulary stays in L2 between
//! them), each a loop without branches or library calls, built for every instruction set by
//! `simd_dispatch!` and computing the same bits on each (`exp_math`).

use super::CrossEntropySpec;
use crate::ops::exp_math::exp_nonpositive;
use crate::ops::simd::{isa, simd_dispatch};
use crate::ops::KernelFloat;

/// Independent accumulators of the maximum and sum passes: enough to fill an AVX-512 register
/// of `f64`s (the reduction order is fixed, so every build sums alike).
const LANES: usize = 8;

/// A class's coefficient `q_k · w_k`: 0 when its target share `q_k` is 0, whatever its weight,
/// so a NaN or infinite weight of a class the target does not name cannot reach the loss (as in
/// PyTorch). A zero coefficient then adds nothing, even where the logit is -inf (masked).
pub(super) fn share(q: f64, w: f64) -> f64 {
    if q == 0.0 {
        0.0
    } else {
        q * w
    }
}

/// `z - max`, a logit's distance below its row's running maximum, for the shifted sum
/// `Σ q w (z - max)`: a masked (-inf) logit stays -inf even before any finite maximum is seen,
/// where the plain difference would be NaN.
pub(super) fn below(z: f64, max: f64) -> f64 {
    if z == f64::NEG_INFINITY {
        z
    } else {
        z - max
    }
}

/// What one row's target is.
#[derive(Clone, Copy)]
pub(super) enum RowTarget<'a, T> {
    /// A class index (not the ignored one).
    Label(usize),
    /// The row's `[C]` class probabilities.
    Probabilities(&'a [T]),
}

#[inline(always)]
fn larger(a: f64, b: f64) -> f64 {
    if b > a {
        b
    } else {
        a
    }
}

#[inline(always)]
fn row_max_body<T: KernelFloat>(z: &[T]) -> f64 {
    let mut m = [f64::NEG_INFINITY; LANES];
    let chunks = z.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, v) in m.iter_mut().zip(c) {
            *m = larger(*m, v.to_f64());
        }
    }
    for (m, v) in m.iter_mut().zip(tail) {
        *m = larger(*m, v.to_f64());
    }
    m.into_iter().fold(f64::NEG_INFINITY, larger)
}

/// `exp(z - max)`, 0 for a masked (`-inf`) logit even when `max` is `-inf` too.
#[inline(always)]
fn term(z: f64, max: f64) -> f64 {
    let e = exp_nonpositive(z - max);
    if z == f64::NEG_INFINITY {
        0.0
    } else {
        e
    }
}

#[inline(always)]
fn exp_sum_body<T: KernelFloat>(z: &[T], max: f64) -> f64 {
    let mut s = [0.0f64; LANES];
    let chunks = z.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (s, v) in s.iter_mut().zip(c) {
            *s += term(v.to_f64(), max);
        }
    }
    for (s, v) in s.iter_mut().zip(tail) {
        *s += term(v.to_f64(), max);
    }
    s.into_iter().fold(0.0, |a, b| a + b)
}

/// `grad_k = exp((z_k - max) - log_sum) * qw - coef(k)`, rounded once.
#[inline(always)]
fn grad_body<T: KernelFloat, F: Fn(usize) -> f64>(
    z: &[T],
    [max, log_sum, qw]: [f64; 3],
    coef: F,
    grad: &mut [T],
) {
    for (k, (g, v)) in grad.iter_mut().zip(z).enumerate() {
        let p = exp_nonpositive((v.to_f64() - max) - log_sum);
        *g = T::from_f64(p * qw - coef(k));
    }
}

simd_dispatch! {
    /// The row's largest logit (NaN skipped; `-inf` for an empty or all-NaN row).
    fn row_max[T: KernelFloat](z: &[T]) -> f64 => row_max_body[T];
}
simd_dispatch! {
    /// `Σ exp(z - max)` over the row's logits that are not `-inf`.
    fn exp_sum[T: KernelFloat](z: &[T], max: f64) -> f64 => exp_sum_body[T];
}
simd_dispatch! {
    /// The row's gradient (see [`grad_body`]).
    fn gradient[T: KernelFloat, F: Fn(usize) -> f64](
        z: &[T],
        stats: [f64; 3],
        coef: F,
        grad: &mut [T],
    ) => grad_body[T, F];
}

/// One row: returns its loss, and writes its gradient when `grad` is given. `weight` is the
/// `[C]` class weights, if any.
pub(super) fn row<T: KernelFloat>(
    spec: &CrossEntropySpec,
    z: &[T],
    target: RowTarget<'_, T>,
    weight: Option<&[T]>,
    grad: Option<&mut [T]>,
) -> T {
    let c = z.len();
    let eps = spec.label_smoothing;
    let smooth = eps / c as f64;
    let w_of = |k: usize| weight.map_or(1.0, |w| w[k].to_f64());
    // q_k w_k of every class (0 where q_k is 0, whatever the weight).
    let coef = |k: usize| match target {
        RowTarget::Label(y) => share(smooth + if k == y { 1.0 - eps } else { 0.0 }, w_of(k)),
        RowTarget::Probabilities(t) => share((1.0 - eps) * t[k].to_f64() + smooth, w_of(k)),
    };
    let chosen = isa();
    let max = row_max(chosen, z);
    let sum = exp_sum(chosen, z, max);
    // S and the shifted sum: over every class when each may have a share, else the label's.
    let (mut qw, mut shifted) = (0.0f64, 0.0f64);
    let mut add = |k: usize| {
        let qwk = coef(k);
        if qwk != 0.0 {
            shifted += qwk * below(z[k].to_f64(), max);
            qw += qwk;
        }
    };
    match target {
        RowTarget::Label(y) if smooth == 0.0 => add(y),
        _ => (0..c).for_each(&mut add),
    }
    // S ln(sum) - shifted: two sums of like sign for non-negative q and w; ln(sum) is never
    // added to `max` (beyond 1e16 it would round away).
    let log_sum = sum.ln();
    if let Some(g) = grad {
        let stats = [max, log_sum, qw];
        match target {
            // Only the label has a share: no weight read per class.
            RowTarget::Label(y) if smooth == 0.0 => {
                let qwy = coef(y);
                gradient(chosen, z, stats, |k| if k == y { qwy } else { 0.0 }, g);
            }
            _ => gradient(chosen, z, stats, coef, g),
        }
    }
    T::from_f64(qw * log_sum - shifted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::loss::{CrossEntropyShape, TargetKind};
    use crate::ops::simd::available;

    fn spec(classes: usize, label_smoothing: f64) -> CrossEntropySpec {
        CrossEntropySpec {
            shape: CrossEntropyShape {
                batch: 1,
                classes,
                inner: 1,
            },
            target: TargetKind::Indices,
            ignore_index: -100,
            label_smoothing,
            with_grad: true,
        }
    }

    /// Every pass gives the portable build's bits on every instruction set this CPU has, on a
    /// row whose length leaves a tail after the lanes and whose logits span exp's whole range.
    #[test]
    fn every_instruction_set_gives_the_portable_bits() {
        let z: Vec<f32> = (0..1003)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * if i % 7 == 0 { 16.0 } else { 0.3 })
            .collect();
        let coef = |k: usize| if k == 5 { 0.75 } else { 0.001 };
        let portable = {
            let max = row_max_body(&z);
            let sum = exp_sum_body(&z, max);
            let mut g = vec![0f32; z.len()];
            grad_body(&z, [max, sum.ln(), 1.5], coef, &mut g);
            (
                max.to_bits(),
                sum.to_bits(),
                g.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            )
        };
        for isa in available().into_iter().map(Some).chain([None]) {
            let max = row_max(isa, &z);
            let sum = exp_sum(isa, &z, max);
            let mut g = vec![0f32; z.len()];
            gradient(isa, &z, [max, sum.ln(), 1.5], coef, &mut g);
            let got = (
                max.to_bits(),
                sum.to_bits(),
                g.iter().map(|v| v.to_bits()).collect(),
            );
            assert_eq!(got, portable, "{isa:?}");
        }
    }

    /// Against the definitions in f64 with libm: a label with and without smoothing, a masked
    /// (-inf) class that gets exactly 0 gradient, and a NaN logit that makes the loss NaN.
    #[test]
    fn rows_match_the_definition_and_keep_masked_and_nan_logits_apart() {
        let z = [
            0.5f64,
            -1.25,
            f64::NEG_INFINITY,
            3.0,
            2.0,
            -0.75,
            0.0,
            1.0,
            0.25,
            -2.0,
        ]
        .repeat(3);
        let c = z.len();
        for eps in [0.0, 0.2] {
            let mut g = vec![0f64; c];
            let loss = row(&spec(c, eps), &z, RowTarget::Label(3), None, Some(&mut g));
            let lse = z.iter().map(|v| v.exp()).sum::<f64>().ln();
            let q = |k: usize| eps / c as f64 + if k == 3 { 1.0 - eps } else { 0.0 };
            let want: f64 = (0..c)
                .filter(|&k| z[k] != f64::NEG_INFINITY)
                .map(|k| q(k) * (lse - z[k]))
                .sum();
            if eps == 0.0 {
                assert!((loss - want).abs() < 1e-14, "{loss} vs {want}");
                for k in 0..c {
                    let want = (z[k] - lse).exp() - q(k);
                    assert!((g[k] - want).abs() < 1e-15, "class {k}: {} vs {want}", g[k]);
                }
                assert_eq!(g[2], 0.0);
            } else {
                // A masked class with a smoothing share has an infinite loss, as in PyTorch.
                assert_eq!(loss, f64::INFINITY);
            }
        }
        let mut z = z;
        z[4] = f64::NAN;
        let loss = row(&spec(c, 0.0), &z, RowTarget::Label(3), None, None);
        assert!(loss.is_nan());
    }
}
