//! Binary cross-entropies, each one autograd node with PyTorch's explicit gradient formulas.
//!
//! Composing them from `log`, `clamp` and `relu` would give the right values but not PyTorch's
//! gradients at the edges: `binary_cross_entropy` clamps each log at -100 yet its gradient is
//! `w (x - y) / max(x (1 - x), 1e-12)` (finite at 0 and 1), and the logits form's gradient at
//! `x = 0` is `σ(0) - y`, not what the subgradients of `|x|` and `max(-x, 0)` give. So the
//! forward values are computed without history and [`Tensor::record_op`] attaches a backward
//! that evaluates the closed forms. Targets get gradients too (PyTorch's `target` derivatives);
//! `weight` and `pos_weight` are constants.

use crate::error::{arg_err, shape_err};
use crate::targets::check_elementwise_target;
use crate::{Reduction, Result};
use kiln_autograd::{broadcast_shapes, no_grad, Tensor};

/// PyTorch's floor on `x (1 - x)` in the gradient: the `float` constant 1e-12 (so, widened, not
/// exactly 1e-12 in double; kept that way to match PyTorch's float64 gradients too).
const BCE_EPSILON: f64 = 1e-12f32 as f64;

/// Options of [`binary_cross_entropy`].
#[derive(Debug, Clone, Copy, Default)]
pub struct BceOptions<'a> {
    /// Per-element weights, broadcastable to the input's shape.
    pub weight: Option<&'a Tensor>,
    /// How the losses are reduced (default mean, over all elements).
    pub reduction: Reduction,
}

/// Options of [`binary_cross_entropy_with_logits`].
#[derive(Debug, Clone, Copy, Default)]
pub struct BceWithLogitsOptions<'a> {
    /// Per-element weights, broadcastable to the input's shape.
    pub weight: Option<&'a Tensor>,
    /// Weight of the positive term per class, broadcastable to the input (usually `[C]`).
    pub pos_weight: Option<&'a Tensor>,
    /// How the losses are reduced (default mean, over all elements).
    pub reduction: Reduction,
}

/// Detached `t`, checked to broadcast to `input`'s shape without growing it.
fn broadcast_operand(
    op: &'static str,
    name: &str,
    input: &Tensor,
    t: Option<&Tensor>,
) -> Result<Option<Tensor>> {
    let Some(t) = t else { return Ok(None) };
    let shape = broadcast_shapes(op, input.shape(), t.shape()).ok();
    if shape.as_deref() != Some(input.shape()) {
        return Err(shape_err(
            op,
            format!(
                "{name} shape {:?} does not broadcast to input shape {:?}; pass a {name} of the \
                 input's shape or one that broadcasts to it",
                t.shape(),
                input.shape()
            ),
        ));
    }
    Ok(Some(t.detach().to_dtype(input.dtype())?))
}

fn times(t: Tensor, w: &Option<Tensor>) -> Result<Tensor> {
    Ok(match w {
        Some(w) => t.mul(w)?,
        None => t,
    })
}

/// PyTorch's `binary_cross_entropy`: `-w (y log x + (1 - y) log(1 - x))` for probabilities
/// `x` in [0, 1], each log clamped at -100 as in PyTorch. An input outside [0, 1] is an error
/// naming the range found on the CPU (and on CUDA under eager checks); on CUDA otherwise the
/// check is skipped so the call never waits, and such an input gives a NaN loss.
pub fn binary_cross_entropy(
    input: &Tensor,
    target: &Tensor,
    options: &BceOptions<'_>,
) -> Result<Tensor> {
    const OP: &str = "binary_cross_entropy";
    check_elementwise_target(OP, input, target)?;
    let w = broadcast_operand(OP, "weight", input, options.weight)?;
    let (x, y) = (input.detach(), target.detach());
    // The range check reads two values back; on a device that would make every call wait, so
    // it runs there only under eager checks (`KILN_CUDA_EAGER_CHECKS=1`). Without it an input
    // outside [0, 1] still shows: its log is NaN, and so is the loss.
    if x.numel() > 0 && (x.device().is_cpu() || kiln_device::eager_checks()) {
        let (lo, hi) = (x.min_all()?.item()?, x.max_all()?.item()?);
        if !(lo >= 0.0 && hi <= 1.0) {
            return Err(arg_err(
                OP,
                format!(
                    "every input element must be a probability in [0, 1], got values in [{lo:?}, \
                     {hi:?}]; apply sigmoid first, or pass the logits to \
                     binary_cross_entropy_with_logits (more stable)"
                ),
            ));
        }
    }
    let losses = no_grad(|| -> Result<Tensor> {
        let log_x = x.log()?.maximum_scalar(-100.0)?;
        let log_1mx = x.rsub_scalar(1.0)?.log()?.maximum_scalar(-100.0)?;
        let l = y
            .mul(&log_x)?
            .add(&y.rsub_scalar(1.0)?.mul(&log_1mx)?)?
            .neg()?;
        times(l, &w)
    })?;
    let losses = Tensor::record_op(
        "BinaryCrossEntropyBackward",
        &[input, target],
        &losses,
        |needs| {
            let (x, y, w) = (
                x.save_for_backward(),
                y.save_for_backward(),
                w.map(|w| w.save_for_backward()),
            );
            let needs = needs.to_vec();
            Box::new(move |g| {
                let gw = times(g.clone(), &w).map_err(into_tensor_error)?;
                let gx = if needs[0] {
                    let denom = x.mul(&x.rsub_scalar(1.0)?)?.maximum_scalar(BCE_EPSILON)?;
                    Some(gw.mul(&x.sub(&y)?)?.div(&denom)?)
                } else {
                    None
                };
                let gy = if needs[1] {
                    // PyTorch does not clamp here: ±inf at probabilities of exactly 0 or 1.
                    Some(gw.mul(&x.rsub_scalar(1.0)?.log()?.sub(&x.log()?)?)?)
                } else {
                    None
                };
                Ok(vec![gx, gy])
            })
        },
    );
    options.reduction.apply(losses)
}

/// Unwraps the tensor error inside a losses error (backward closures return tensor errors).
fn into_tensor_error(e: crate::Error) -> kiln_autograd::Error {
    match e {
        crate::Error::Tensor(t) => t,
        other => kiln_autograd::Error::Autograd(other.to_string()),
    }
}

/// PyTorch's `binary_cross_entropy_with_logits`: `-w (p y log σ(x) + (1 - y) log σ(-x))` with
/// `p` = `pos_weight` (1 when absent), computed stably as
/// `w ((1 - y) x + (1 + (p - 1) y) · softplus(-x))`.
pub fn binary_cross_entropy_with_logits(
    input: &Tensor,
    target: &Tensor,
    options: &BceWithLogitsOptions<'_>,
) -> Result<Tensor> {
    const OP: &str = "binary_cross_entropy_with_logits";
    check_elementwise_target(OP, input, target)?;
    let w = broadcast_operand(OP, "weight", input, options.weight)?;
    let pw = broadcast_operand(OP, "pos_weight", input, options.pos_weight)?;
    let (x, y) = (input.detach(), target.detach());
    // softplus(-x) = log(1 + e^{-|x|}) + max(-x, 0), never overflowing.
    let softplus_neg = |x: &Tensor| -> kiln_autograd::Result<Tensor> {
        x.abs()?
            .neg()?
            .exp()?
            .add_scalar(1.0)?
            .log()?
            .add(&x.neg()?.relu()?)
    };
    let losses = no_grad(|| -> Result<Tensor> {
        let sp = softplus_neg(&x)?;
        let scale = match &pw {
            Some(p) => p.sub_scalar(1.0)?.mul(&y)?.add_scalar(1.0)?,
            None => sp.ones_like()?,
        };
        let l = y.rsub_scalar(1.0)?.mul(&x)?.add(&scale.mul(&sp)?)?;
        times(l, &w)
    })?;
    let losses = Tensor::record_op(
        "BinaryCrossEntropyWithLogitsBackward",
        &[input, target],
        &losses,
        |needs| {
            let (x, y) = (x.save_for_backward(), y.save_for_backward());
            let (w, pw) = (
                w.map(|t| t.save_for_backward()),
                pw.map(|t| t.save_for_backward()),
            );
            let needs = needs.to_vec();
            Box::new(move |g| {
                let gw = times(g.clone(), &w).map_err(into_tensor_error)?;
                let gx = if needs[0] {
                    let s = x.sigmoid()?;
                    let d = match &pw {
                        // σ(x) (p y + 1 - y) - p y
                        Some(p) => {
                            let py = p.mul(&y)?;
                            s.mul(&py.add(&y.rsub_scalar(1.0)?)?)?.sub(&py)?
                        }
                        None => s.sub(&y)?,
                    };
                    Some(gw.mul(&d)?)
                } else {
                    None
                };
                let gy = if needs[1] {
                    // (p - 1) softplus(-x) - x
                    let d = match &pw {
                        Some(p) => p.sub_scalar(1.0)?.mul(&softplus_neg(&x)?)?.sub(&x)?,
                        None => x.neg()?,
                    };
                    Some(gw.mul(&d)?)
                } else {
                    None
                };
                Ok(vec![gx, gy])
            })
        },
    );
    options.reduction.apply(losses)
}
