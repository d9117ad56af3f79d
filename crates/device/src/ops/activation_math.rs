//! The transcendental activations of `f32` tensors (`exp`, `tanh`, `sigmoid`, SiLU, tanh-GELU
//! and the backwards of the last two), computed in `f64` by branch-free formulas over
//! [`exp_nonpositive`] and rounded to `f32` once by the caller. libm's scalar `expf`/`tanhf`
//! are one call per element; these compile to vector instructions inside a `simd_dispatch!`
//! loop.
//!
//! Invariants: every function takes an `f32` value widened to `f64` (any finite `f32`, the
//! infinities and NaN), and its result rounded to `f32` is within one `f32` unit of the exact value
//! (tested against libm in `f64` at every scale; the `f64` working error is far below that unit,
//! `tanh` just above its series' range losing the most to the cancellation in `1 - e`). NaN gives
//! NaN. Only `+`, `-`, `*`, `/`, comparisons and bit moves are used (no `mul_add`), so every
//! instruction set computes the same bits. Only `f32` (and `f16`/`bf16`, which compute in `f32`)
//! use them: `f64` tensors keep libm's functions, whose results are correct to about one `f64`
//! unit.
//!
//! Each function is one exponential of a non-positive argument: `exp(-|x|)` gives both halves
//! of the logistic curve without overflow (`σ(x) = 1 / (1 + e)` for `x >= 0`, `e / (1 + e)`
//! below) and `σ(x)(1 - σ(x)) = e / (1 + e)^2` without cancellation; tanh-GELU is written as
//! `x σ(2u)` with `u = √(2/π)(x + 0.044715 x³)`, which equals `x (1 + tanh u) / 2` and does
//! not cancel for negative `x`.

use super::exp_math::exp_nonpositive;

/// `√(2/π)`, the tanh-GELU's inner scale.
pub(crate) const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
/// The tanh-GELU's cubic coefficient.
pub(crate) const GELU_TANH_COEF: f64 = 0.044715;
/// Below this magnitude `tanh` is its two-term series (its error there is below `2^-50`).
const TANH_SERIES_BELOW: f64 = 1.0 / 4096.0;

/// `e^x` (`+inf` past `f32`'s range, 0 far below it).
#[inline(always)]
pub(crate) fn exp(x: f64) -> f64 {
    let e = exp_nonpositive(-x.abs());
    if x > 0.0 {
        1.0 / e
    } else {
        e
    }
}

/// `σ(x) = 1 / (1 + e^-x)` and its derivative `σ(x)(1 - σ(x))`.
#[inline(always)]
pub(crate) fn sigmoid(x: f64) -> (f64, f64) {
    let e = exp_nonpositive(-x.abs());
    let d = 1.0 + e;
    let num = if x >= 0.0 { 1.0 } else { e };
    (num / d, e / (d * d))
}

/// `tanh x`: `(1 - e) / (1 + e)` with `e = exp(-2|x|)`, the sign of `x` put back; below
/// [`TANH_SERIES_BELOW`], `|x| - |x|³/3`, where `1 - e` would lose digits to cancellation.
#[inline(always)]
pub(crate) fn tanh(x: f64) -> f64 {
    let a = x.abs();
    let e = exp_nonpositive(-2.0 * a);
    let series = a - a * a * a * (1.0 / 3.0);
    let t = if a < TANH_SERIES_BELOW {
        series
    } else {
        (1.0 - e) / (1.0 + e)
    };
    t.copysign(x)
}

/// `2u = 2√(2/π)(x + 0.044715 x³)`, the tanh-GELU's logistic argument, and its derivative.
#[inline(always)]
fn gelu_inner(x: f64) -> (f64, f64) {
    let x2 = x * x;
    let v = 2.0 * SQRT_2_OVER_PI * (x + GELU_TANH_COEF * x2 * x);
    let dv = 2.0 * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_TANH_COEF * x2);
    (v, dv)
}

/// tanh-GELU, `x σ(2u)` (see the module docs).
#[inline(always)]
pub(crate) fn gelu_tanh(x: f64) -> f64 {
    x * sigmoid(gelu_inner(x).0).0
}

/// The tanh-GELU's input gradient for output gradient `g`: `g (σ(2u) + x σ'(2u) 2u')`.
#[inline(always)]
pub(crate) fn gelu_tanh_backward(g: f64, x: f64) -> f64 {
    let (v, dv) = gelu_inner(x);
    let (s, ds) = sigmoid(v);
    g * (s + x * ds * dv)
}

/// SiLU, `x σ(x)`.
#[inline(always)]
pub(crate) fn silu(x: f64) -> f64 {
    x * sigmoid(x).0
}

/// SiLU's input gradient for output gradient `g`: `g (σ(x) + x σ(x)(1 - σ(x)))`.
#[inline(always)]
pub(crate) fn silu_backward(g: f64, x: f64) -> f64 {
    let (s, ds) = sigmoid(x);
    g * (s + x * ds)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `f32` arguments spread over every scale, both signs: a dense sweep of `[-20, 20]` and
    /// logarithmically spaced magnitudes from `1e-30` to `1e4`.
    fn arguments() -> Vec<f32> {
        let dense = (0..80_001).map(|i| -20.0 + i as f64 * 5e-4);
        let spread = (0..40_000).map(|i| 10f64.powf(-30.0 + 34.0 * i as f64 / 40_000.0));
        dense
            .chain(spread.clone())
            .chain(spread.map(|v| -v))
            .map(|v| v as f32)
            .collect()
    }

    /// Distance in `f32` units between `got` rounded to `f32` and the reference (computed in
    /// `f64` by libm): 0 is correctly rounded, and the module promises at most 1.
    fn f32_units(got: f64, reference: f64) -> f64 {
        let (g, r) = (got as f32, reference as f32);
        if g == r {
            return 0.0;
        }
        let unit = f32::from_bits(r.abs().to_bits() + 1) - r.abs();
        f64::from((g - r).abs() / unit.max(f32::from_bits(1)))
    }

    fn worst(f: impl Fn(f64) -> f64, reference: impl Fn(f64) -> f64) -> f64 {
        arguments()
            .into_iter()
            .map(|x| f32_units(f(f64::from(x)), reference(f64::from(x))))
            .fold(0.0, f64::max)
    }

    /// A function of one `f64`, as the cases below list them.
    type Scalar = dyn Fn(f64) -> f64;

    fn libm_sigmoid(x: f64) -> f64 {
        1.0 / (1.0 + (-x).exp())
    }

    #[test]
    fn every_function_rounds_to_f32_within_one_unit_of_libm() {
        let gelu =
            |x: f64| 0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + GELU_TANH_COEF * x * x * x)).tanh());
        let gelu_grad = |x: f64| {
            let t = (SQRT_2_OVER_PI * (x + GELU_TANH_COEF * x * x * x)).tanh();
            let dinner = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_TANH_COEF * x * x);
            0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dinner
        };
        let cases: [(&str, &Scalar, &Scalar); 7] = [
            ("exp", &exp, &f64::exp),
            ("tanh", &tanh, &f64::tanh),
            ("sigmoid", &|x| sigmoid(x).0, &libm_sigmoid),
            ("silu", &silu, &|x| x * libm_sigmoid(x)),
            ("silu'", &|x| silu_backward(1.0, x), &|x| {
                let s = libm_sigmoid(x);
                s * (1.0 + x * (1.0 - s))
            }),
            ("gelu", &gelu_tanh, &gelu),
            ("gelu'", &|x| gelu_tanh_backward(1.0, x), &gelu_grad),
        ];
        for (name, f, reference) in cases {
            // The libm references in `f64` cancel where the formulas here do not (`1 + tanh u`
            // for negative `x`), so they are compared where they are accurate.
            let w = match name {
                "gelu" | "gelu'" => arguments()
                    .into_iter()
                    .filter(|&x| x > -3.0)
                    .map(|x| f32_units(f(f64::from(x)), reference(f64::from(x))))
                    .fold(0.0, f64::max),
                _ => worst(f, reference),
            };
            assert!(w <= 1.0, "{name}: worst {w} f32 units from libm");
        }
    }

    #[test]
    fn far_tails_keep_their_digits() {
        // GELU of a negative argument is tiny, not 0 as `x (1 + tanh u) / 2` rounds it in f32:
        // x σ(2u) with σ(2u) = e / (1 + e) computed from e = exp(2u) directly.
        let x = -10.0f64;
        let v = 2.0 * SQRT_2_OVER_PI * (x + GELU_TANH_COEF * x * x * x);
        let want = x * v.exp() / (1.0 + v.exp());
        assert!(((gelu_tanh(x) - want) / want).abs() < 1e-14);
        assert!(gelu_tanh(x) < 0.0);
        // The logistic curve's lower half and its derivative there.
        let (s, ds) = sigmoid(-40.0);
        assert!(((s - (-40.0f64).exp()) / s).abs() < 1e-14);
        assert!(((ds - (-40.0f64).exp()) / ds).abs() < 1e-14);
    }

    /// `f`, rounded to `f32`, over [`arguments`] through `dense_map1` on every instruction set
    /// this CPU has, against the portable build, bit for bit. `f` is passed as its own type (a
    /// function item or closure, not a pointer), so each build inlines and vectorises it.
    fn same_bits_on_every_isa(name: &str, f: impl Fn(f64) -> f64) {
        use crate::ops::strided::dense_map1;
        let xs = arguments();
        let round = |x: f32| f(f64::from(x)) as f32;
        let mut portable = vec![0.0f32; xs.len()];
        dense_map1(None, &xs, &mut portable, &round);
        for isa in crate::ops::simd::available().into_iter().map(Some) {
            let mut got = vec![0.0f32; xs.len()];
            dense_map1(isa, &xs, &mut got, &round);
            let same = got
                .iter()
                .zip(&portable)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{name} on {isa:?}");
        }
    }

    #[test]
    fn every_instruction_set_computes_the_same_bits() {
        same_bits_on_every_isa("exp", exp);
        same_bits_on_every_isa("tanh", tanh);
        same_bits_on_every_isa("sigmoid", |x| sigmoid(x).0);
        same_bits_on_every_isa("silu", silu);
        same_bits_on_every_isa("gelu", gelu_tanh);
        same_bits_on_every_isa("gelu'", |x| gelu_tanh_backward(0.75, x));
        same_bits_on_every_isa("silu'", |x| silu_backward(0.75, x));
    }

    #[test]
    fn special_values() {
        let inf = f64::INFINITY;
        assert_eq!(exp(inf), inf);
        assert_eq!(exp(-inf), 0.0);
        assert_eq!(exp(100.0) as f32, f32::INFINITY);
        assert_eq!(exp(0.0), 1.0);
        assert_eq!((tanh(inf), tanh(-inf)), (1.0, -1.0));
        assert_eq!(tanh(-0.0).to_bits(), (-0.0f64).to_bits());
        assert_eq!(tanh(0.0).to_bits(), 0);
        assert_eq!((sigmoid(inf), sigmoid(-inf)), ((1.0, 0.0), (0.0, 0.0)));
        assert_eq!(sigmoid(0.0), (0.5, 0.25));
        assert_eq!((gelu_tanh(inf), gelu_tanh(0.0)), (inf, 0.0));
        assert_eq!(silu(inf), inf);
        for f in [
            exp,
            tanh,
            |x| sigmoid(x).0,
            |x| sigmoid(x).1,
            gelu_tanh,
            silu,
            |x| gelu_tanh_backward(1.0, x),
            |x| silu_backward(1.0, x),
        ] {
            assert!(f(f64::NAN).is_nan());
        }
    }
}
