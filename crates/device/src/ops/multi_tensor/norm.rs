//! Norm arithmetic shared by both devices' multi-tensor kernels: which norm a PyTorch
//! `norm_type` names ([`NormKind`]), how partial reductions combine and finish, and the clip
//! coefficient.
//!
//! Invariants: every function here is pure host arithmetic on `f64`; NaN propagates through
//! `max`/`min` and the clip coefficient exactly as in PyTorch; a NaN `norm_type` names no norm
//! (`NormKind::from_norm_type` returns `None`, and callers report it as an invalid norm type).

/// Which vector norm to compute, decoded from PyTorch's `norm_type` float.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NormKind {
    /// `p = 0`: the number of nonzero elements.
    Zero,
    /// `p = 1`: the sum of absolute values.
    One,
    /// `p = 2`: the Euclidean norm.
    Two,
    /// `p = inf`: the largest absolute value (NaN-propagating).
    Inf,
    /// `p = -inf`: the smallest absolute value (NaN-propagating).
    NegInf,
    /// Any other `p`: `(sum |x|^p)^(1/p)`.
    P(f64),
}

impl NormKind {
    /// Decodes `norm_type`; `None` for NaN, which names no norm.
    pub fn from_norm_type(norm_type: f64) -> Option<NormKind> {
        Some(if norm_type.is_nan() {
            return None;
        } else if norm_type == 0.0 {
            NormKind::Zero
        } else if norm_type == 1.0 {
            NormKind::One
        } else if norm_type == 2.0 {
            NormKind::Two
        } else if norm_type == f64::INFINITY {
            NormKind::Inf
        } else if norm_type == f64::NEG_INFINITY {
            NormKind::NegInf
        } else {
            NormKind::P(norm_type)
        })
    }

    /// The reduction's value over no elements.
    pub fn identity(self) -> f64 {
        match self {
            NormKind::NegInf => f64::INFINITY,
            _ => 0.0,
        }
    }

    /// Combines two partial reductions (sum, or NaN-propagating max/min).
    pub fn combine(self, a: f64, b: f64) -> f64 {
        match self {
            NormKind::Inf => nan_max(a, b),
            NormKind::NegInf => nan_min(a, b),
            _ => a + b,
        }
    }

    /// Turns a tensor's reduced value (sum of `|x|^p`, max, count) into its norm.
    pub fn finish(self, reduced: f64) -> f64 {
        match self {
            NormKind::Zero | NormKind::One | NormKind::Inf | NormKind::NegInf => reduced,
            NormKind::Two => reduced.sqrt(),
            NormKind::P(p) => reduced.powf(1.0 / p),
        }
    }

    /// The per-element contribution of a norm value when norms are themselves reduced (the total
    /// norm is the norm of the per-tensor norms, as in PyTorch's `clip_grad_norm_`).
    pub fn element(self, x: f64) -> f64 {
        let a = x.abs();
        match self {
            NormKind::Zero => {
                if a != 0.0 {
                    1.0
                } else {
                    0.0
                }
            }
            NormKind::One | NormKind::Inf | NormKind::NegInf => a,
            NormKind::Two => a * a,
            NormKind::P(p) => a.powf(p),
        }
    }

    /// The norm of a list of values (used for the total over per-tensor norms).
    pub fn norm_of(self, values: &[f64]) -> f64 {
        let reduced = values.iter().fold(self.identity(), |acc, &v| {
            self.combine(acc, self.element(v))
        });
        self.finish(reduced)
    }
}

/// `max` that returns NaN when either side is NaN (PyTorch's `max`).
pub fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b > a {
        if a.is_nan() {
            a
        } else {
            b
        }
    } else if b.is_nan() {
        b
    } else {
        a
    }
}

/// `min` that returns NaN when either side is NaN.
pub fn nan_min(a: f64, b: f64) -> f64 {
    -nan_max(-a, -b)
}

/// The clip coefficient `min(max_norm / (total_norm + 1e-6), 1)`, NaN when `total_norm` is NaN
/// (PyTorch clamps with `torch.clamp`, which keeps NaN).
pub fn clip_coef(max_norm: f64, total_norm: f64) -> f64 {
    let coef = max_norm / (total_norm + 1e-6);
    if coef.is_nan() {
        coef
    } else {
        coef.min(1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn norm_kinds_and_clip_coef_follow_pytorch() {
        assert_eq!(NormKind::from_norm_type(2.0), Some(NormKind::Two));
        assert_eq!(NormKind::from_norm_type(f64::INFINITY), Some(NormKind::Inf));
        assert_eq!(NormKind::from_norm_type(3.0), Some(NormKind::P(3.0)));
        assert_eq!(NormKind::from_norm_type(f64::NAN), None);
        assert_eq!(NormKind::Two.norm_of(&[3.0, 4.0]), 5.0);
        assert_eq!(NormKind::One.norm_of(&[3.0, -4.0]), 7.0);
        assert_eq!(NormKind::Inf.norm_of(&[3.0, -4.0]), 4.0);
        assert!(NormKind::Inf.norm_of(&[f64::NAN, 4.0]).is_nan());
        assert!(NormKind::Inf.norm_of(&[4.0, f64::NAN]).is_nan());
        assert_eq!(NormKind::NegInf.norm_of(&[3.0, -4.0]), 3.0);
        assert_eq!(NormKind::Zero.norm_of(&[0.0, -4.0, 1.0]), 2.0);
        assert!((NormKind::P(3.0).norm_of(&[1.0, 2.0]) - 9f64.cbrt()).abs() < 1e-15);
        assert_eq!(clip_coef(1.0, 0.5), 1.0);
        assert_eq!(clip_coef(1.0, 4.0 - 1e-6), 0.25);
        assert!(clip_coef(1.0, f64::NAN).is_nan());
        assert_eq!(clip_coef(1.0, f64::INFINITY), 0.0);
    }
}
