//! Elementwise regression losses, composed from tensor ops (their gradients come from the
//! parts): `mse_loss`, `l1_loss`, `smooth_l1_loss`, `huber_loss`. Targets must be floats of the
//! input's shape and dtype (see the module `targets`); both input and target get gradients.

use crate::error::arg_err;
use crate::targets::check_elementwise_target;
use crate::{Reduction, Result};
use kiln_autograd::Tensor;

/// PyTorch's `mse_loss`: `(input - target)²`, reduced.
pub fn mse_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    check_elementwise_target("mse_loss", input, target)?;
    reduction.apply(input.sub(target)?.square()?)
}

/// PyTorch's `l1_loss`: `|input - target|`, reduced (gradient 0 where they are equal).
pub fn l1_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    check_elementwise_target("l1_loss", input, target)?;
    reduction.apply(input.sub(target)?.abs()?)
}

/// `|d| < threshold ? quadratic : linear` over `d = input - target`, quadratic `0.5 d² · q` and
/// linear `l · (|d| - 0.5 · threshold)`.
fn piecewise(input: &Tensor, target: &Tensor, threshold: f64, q: f64, l: f64) -> Result<Tensor> {
    let d = input.sub(target)?;
    let abs = d.abs()?;
    let quadratic = d.square()?.mul_scalar(0.5 * q)?;
    let linear = abs.sub_scalar(0.5 * threshold)?.mul_scalar(l)?;
    Ok(Tensor::where_(
        &abs.lt_scalar(threshold)?,
        &quadratic,
        &linear,
    )?)
}

/// PyTorch's `smooth_l1_loss` with `beta` (default 1.0): `0.5 d² / beta` where `|d| < beta`,
/// else `|d| - 0.5 beta`; `beta = 0` is `l1_loss`.
pub fn smooth_l1_loss(
    input: &Tensor,
    target: &Tensor,
    reduction: Reduction,
    beta: f64,
) -> Result<Tensor> {
    const OP: &str = "smooth_l1_loss";
    check_elementwise_target(OP, input, target)?;
    if beta.is_nan() || beta < 0.0 || beta.is_infinite() {
        return Err(arg_err(
            OP,
            format!("beta must be a finite number >= 0, got {beta:?}; the default is 1.0"),
        ));
    }
    if beta == 0.0 {
        return l1_loss(input, target, reduction);
    }
    reduction.apply(piecewise(input, target, beta, 1.0 / beta, 1.0)?)
}

/// PyTorch's `huber_loss` with `delta` (default 1.0): `0.5 d²` where `|d| < delta`, else
/// `delta (|d| - 0.5 delta)`.
pub fn huber_loss(
    input: &Tensor,
    target: &Tensor,
    reduction: Reduction,
    delta: f64,
) -> Result<Tensor> {
    const OP: &str = "huber_loss";
    check_elementwise_target(OP, input, target)?;
    if delta.is_nan() || delta <= 0.0 || delta.is_infinite() {
        return Err(arg_err(
            OP,
            format!("delta must be a finite number > 0, got {delta:?}; the default is 1.0"),
        ));
    }
    reduction.apply(piecewise(input, target, delta, 1.0, delta)?)
}
