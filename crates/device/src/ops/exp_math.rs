//! `exp(x)` for `x <= 0`, written without branches or library calls so that a loop over a row
//! compiles to vector instructions (the `simd_dispatch!` builds of cross-entropy's and
//! softmax's row passes); libm's scalar `exp` is one call per element, which made
//! cross-entropy over a language model's vocabulary several times slower than PyTorch's
//! vectorised kernel.
//!
//! Invariants: the result stays within a few units in the last place of `f64::exp` wherever that
//! is a normal number, and within one unit of the smallest subnormal below that; `-inf` and
//! everything below `-745.2` (where the true value rounds to zero) give exactly 0, NaN gives NaN;
//! only plain `+`, `-`, `*` and bit moves are used (no `mul_add`), so every instruction set
//! computes the same bits. Positive arguments are outside the domain (no caller has one: a
//! softmax's `z - max` is never positive).
//!
//! Method: `x = k ln 2 + r` with `k` the nearest integer to `x / ln 2` (found by adding and
//! subtracting `1.5 * 2^52`, whose last bit is 1, so the sum's low bits hold `k`) and
//! `|r| <= ln(2) / 2`, `ln 2` carried in two parts so `k * LN2_HI` is exact; `exp(r)` is its
//! Taylor series to the 13th power (remainder below `2^-57` of the result, summed by Estrin's
//! scheme); `2^k` is applied as two powers of two of about `k / 2` each, so both are normal
//! numbers and only the last multiplication rounds, into a subnormal where the result is one.

/// `ln 2`, split so that `k * LN2_HI` is exact for any `|k| < 2^21` (its low 21 bits are zero).
pub(crate) const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
/// `ln 2 - LN2_HI`.
pub(crate) const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
/// `1.5 * 2^52`: adding it to a value of magnitude below `2^51` rounds that value to an integer
/// held in the sum's low mantissa bits.
const ROUNDER: f64 = 6_755_399_441_055_744.0;
/// Below this, `exp` rounds to zero (`-1075 ln 2` is about `-745.13`).
const UNDERFLOW: f64 = -745.2;
/// `1 / n!` for `n` in `0..=13`: the Taylor series of `exp(r)`.
const EXP: [f64; 14] = [
    1.0,
    1.0,
    1.0 / 2.0,
    1.0 / 6.0,
    1.0 / 24.0,
    1.0 / 120.0,
    1.0 / 720.0,
    1.0 / 5_040.0,
    1.0 / 40_320.0,
    1.0 / 362_880.0,
    1.0 / 3_628_800.0,
    1.0 / 39_916_800.0,
    1.0 / 479_001_600.0,
    1.0 / 6_227_020_800.0,
];

/// `2^j` for an integer-valued `j` in `[-1022, 1023]`, built from its bits.
#[inline(always)]
fn pow2(j: f64) -> f64 {
    // j + 1023 (in 1..=2046) as an integer: the low bits of ROUNDER + j + 1023.
    let biased = (j + 1023.0 + ROUNDER)
        .to_bits()
        .wrapping_sub(ROUNDER.to_bits());
    f64::from_bits(biased << 52)
}

/// `Σ EXP[n] r^n` by Estrin's scheme: pairs, then pairs of pairs, so the longest chain of
/// dependent operations is 8 rather than Horner's 26 (a loop over a row is bound by the vector
/// units' throughput, not by one element's latency).
#[inline(always)]
fn estrin(r: f64) -> f64 {
    let r2 = r * r;
    let r4 = r2 * r2;
    let r8 = r4 * r4;
    let pair = |n: usize| EXP[n] + EXP[n + 1] * r;
    let b0 = pair(0) + pair(2) * r2;
    let b1 = pair(4) + pair(6) * r2;
    let b2 = pair(8) + pair(10) * r2;
    (b0 + b1 * r4) + (b2 + pair(12) * r4) * r8
}

/// `exp(x)` for `x <= 0` (see the module docs).
#[inline(always)]
pub(crate) fn exp_nonpositive(x: f64) -> f64 {
    let k = (x * std::f64::consts::LOG2_E + ROUNDER) - ROUNDER;
    let r = (x - k * LN2_HI) - k * LN2_LO;
    let series = estrin(r);
    // k in [-1075, 0] for x in [UNDERFLOW, 0]: split as k1 + k2, both in [-538, 0].
    let k1 = (k * 0.5 + ROUNDER) - ROUNDER;
    let k2 = k - k1;
    let value = series * pow2(k1) * pow2(k2);
    // Far below the domain's end k is garbage, and NaN compares false, so it stays NaN.
    if x < UNDERFLOW {
        0.0
    } else {
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_testkit::ulps;

    #[test]
    fn exp_stays_within_two_ulps_of_libm_over_the_whole_domain() {
        let mut worst = 0.0f64;
        // Every scale: a dense sweep near 0, then logarithmically spaced arguments to -708.
        let near: Vec<f64> = (0..200_000).map(|i| -(i as f64) * 1e-5).collect();
        let far: Vec<f64> = (0..200_000)
            .map(|i| -(10f64.powf(-12.0 + 14.85 * i as f64 / 200_000.0)))
            .collect();
        for &x in near.iter().chain(&far).filter(|&&x| x >= -708.0) {
            worst = worst.max(ulps(exp_nonpositive(x), x.exp()));
        }
        assert!(worst <= 2.0, "worst error {worst} ulps");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(-0.0), 1.0);
    }

    #[test]
    fn subnormal_results_underflow_to_zero_and_nan_stays_nan() {
        // Subnormal results: within one unit of the smallest subnormal.
        let tiny = f64::from_bits(1);
        for i in 0..4_000 {
            let x = -708.5 - i as f64 * 0.009;
            let (got, want) = (exp_nonpositive(x), x.exp());
            assert!(
                (got - want).abs() <= tiny,
                "exp({x}) = {got:e}, libm {want:e}"
            );
        }
        for x in [-745.3, -746.0, -1e5, -1e300, f64::MIN, f64::NEG_INFINITY] {
            assert_eq!(exp_nonpositive(x).to_bits(), 0, "exp({x})");
        }
        assert!(exp_nonpositive(f64::NAN).is_nan());
    }
}
