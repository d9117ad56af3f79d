//! `cross_entropy` (one fused kernel and one autograd node) and `nll_loss` (a composition).
//!
//! `cross_entropy` hands the logits, targets and class weights to the backend seam's
//! `softmax_cross_entropy`, which returns the per-position losses, the mean's denominator and,
//! when the logits need a gradient, `∂loss/∂logits` per position. The autograd node keeps that
//! gradient and multiplies it by the upstream gradient (broadcast over the class dim) in
//! backward, so no softmax is recomputed. Reductions are then ordinary tensor ops: `'mean'`
//! divides the sum by the kernel's denominator, which is PyTorch's rule (the sum of the weights
//! of the non-ignored targets; the number of positions for probability targets).
//!
//! `nll_loss` takes log-probabilities: it gathers `input[n, y, d]` at each position's target
//! class and multiplies by `w[y]` (0 for ignored positions), all as device ops, so it never reads
//! the targets back to the host except to validate CPU targets; its gradient is gather's
//! (the weights scattered back into the class dim).

use crate::error::{arg_err, dtype_err, shape_err, Error};
use crate::one_hot::{check_label_dtype, labels_to_host, unravel};
use crate::targets::{check_class_targets, check_logits, index_shape};
use crate::{Reduction, Result};
use kiln_autograd::{is_grad_enabled, DType, Tensor};
use kiln_device::ops::loss::{CrossEntropyShape, CrossEntropySpec, TargetKind};
use kiln_device::ops::KernelError;
use kiln_device::prelude::*;

/// Options of [`cross_entropy`] (PyTorch's keyword arguments and defaults).
#[derive(Debug, Clone, Copy)]
pub struct CrossEntropyOptions<'a> {
    /// Class weights `[C]` (PyTorch's `weight`), the input's dtype.
    pub weight: Option<&'a Tensor>,
    /// Class-index targets equal to this contribute nothing (default -100).
    pub ignore_index: i64,
    /// How the per-position losses are reduced (default mean).
    pub reduction: Reduction,
    /// Label smoothing ε in `[0, 1]` (default 0).
    pub label_smoothing: f64,
}

impl Default for CrossEntropyOptions<'_> {
    fn default() -> Self {
        CrossEntropyOptions {
            weight: None,
            ignore_index: -100,
            reduction: Reduction::Mean,
            label_smoothing: 0.0,
        }
    }
}

/// Options of [`nll_loss`] (PyTorch's keyword arguments and defaults).
#[derive(Debug, Clone, Copy)]
pub struct NllLossOptions<'a> {
    /// Class weights `[C]`, the input's dtype.
    pub weight: Option<&'a Tensor>,
    /// Targets equal to this contribute nothing (default -100).
    pub ignore_index: i64,
    /// How the per-position losses are reduced (default mean).
    pub reduction: Reduction,
}

impl Default for NllLossOptions<'_> {
    fn default() -> Self {
        NllLossOptions {
            weight: None,
            ignore_index: -100,
            reduction: Reduction::Mean,
        }
    }
}

/// Checks class weights: `[C]`, the input's dtype and device.
fn check_weight(
    op: &'static str,
    input: &Tensor,
    weight: Option<&Tensor>,
    classes: usize,
) -> Result<()> {
    let Some(w) = weight else { return Ok(()) };
    if w.shape() != [classes] {
        return Err(shape_err(
            op,
            format!(
                "weight shape {:?} does not fit input shape {:?}: class weights need shape \
                 [{classes}], one per class",
                w.shape(),
                input.shape()
            ),
        ));
    }
    if w.dtype() != input.dtype() {
        return Err(dtype_err(
            op,
            format!(
                "weight dtype {} differs from the input's {}; convert with \
                 weight.to_dtype(DType::{:?})",
                w.dtype(),
                input.dtype(),
                input.dtype()
            ),
        ));
    }
    Ok(())
}

fn ignore_text(ignore_index: i64) -> String {
    format!(", or equal ignore_index ({ignore_index})")
}

/// PyTorch's `torch.nn.functional.cross_entropy`: logits `[N, C, d1, ...]` (or `[C]`) against
/// class-index targets (`I64`/`U8`, shape `[N, d1, ...]`, or `[]`) or class-probability
/// targets (floats of the logits' shape). Gradients flow to the logits.
pub fn cross_entropy(
    input: &Tensor,
    target: &Tensor,
    options: &CrossEntropyOptions<'_>,
) -> Result<Tensor> {
    const OP: &str = "cross_entropy";
    let classes = check_logits(OP, input, "logits")?;
    let kind = check_class_targets(OP, input, target, true)?;
    check_weight(OP, input, options.weight, classes)?;
    let eps = options.label_smoothing;
    if !(0.0..=1.0).contains(&eps) {
        return Err(arg_err(
            OP,
            format!("label_smoothing must lie in [0, 1], got {eps:?}; pass e.g. 0.1"),
        ));
    }
    if input.rank() == 1 {
        // Unbatched: [C] logits with a 0-d index or [C] probability target.
        let out = cross_entropy(&input.unsqueeze(0)?, &target.unsqueeze(0)?, options)?;
        return match options.reduction {
            Reduction::None => Ok(out.squeeze_dim(0)?),
            _ => Ok(out),
        };
    }
    let shape = CrossEntropyShape {
        batch: input.shape()[0],
        classes,
        inner: input.shape()[2..].iter().product(),
    };
    let with_grad = is_grad_enabled() && input.requires_grad();
    let spec = CrossEntropySpec {
        shape,
        target: kind,
        ignore_index: options.ignore_index,
        label_smoothing: eps,
        with_grad,
    };
    let out = {
        let logits = input.storage_read();
        let targets = target.storage_read();
        let weight = options
            .weight
            .map(|w| (w.storage_read(), w.layout().clone()));
        logits.softmax_cross_entropy(
            input.layout(),
            &targets,
            target.layout(),
            weight.as_ref().map(|(s, l)| (&**s, l)),
            &spec,
        )
    };
    let out = out.map_err(|e| match e {
        kiln_device::Error::Kernel(KernelError::IndexOutOfRange {
            index, position, ..
        }) => {
            let flat = position[0] * shape.inner + position[1];
            Error::TargetOutOfRange {
                op: OP,
                value: index,
                position: unravel(flat, target.shape()),
                classes,
                ignore: ignore_text(options.ignore_index),
            }
        }
        other => other.into(),
    })?;
    let loss_shape = index_shape(input.shape());
    let losses = Tensor::from_storage_contiguous(out.losses, &loss_shape)?;
    let grad = out
        .grad
        .map(|g| Tensor::from_storage_contiguous(g, input.shape()))
        .transpose()?;
    // Probability targets get PyTorch's target gradient, -(1 - ε) w_c log_softmax(x)_c per
    // position, computed in backward from the saved logits (only when the target needs it).
    let probabilities = kind == TargetKind::Probabilities;
    let inputs: Vec<&Tensor> = if probabilities {
        vec![input, target]
    } else {
        vec![input]
    };
    let mut weight_shape = vec![1; input.rank()];
    weight_shape[1] = classes;
    let losses = Tensor::record_op("CrossEntropyBackward", &inputs, &losses, |needs| {
        let target_needs = needs.get(1).copied().unwrap_or(false);
        let logits = target_needs.then(|| input.save_for_backward());
        let weight = options.weight.map(|w| w.save_for_backward());
        let n_inputs = needs.len();
        Box::new(move |g| {
            let g = g.unsqueeze(1)?;
            let grad_input = grad.as_ref().map(|unit| unit.mul(&g)).transpose()?;
            let grad_target = match &logits {
                Some(x) => {
                    let mut t = x.log_softmax(1)?.mul_scalar(-(1.0 - eps))?;
                    if let Some(w) = &weight {
                        t = t.mul(&w.reshape_to(&weight_shape)?)?;
                    }
                    Some(t.mul(&g)?)
                }
                None => None,
            };
            let mut grads = vec![grad_input, grad_target];
            grads.truncate(n_inputs);
            Ok(grads)
        })
    });
    Ok(match options.reduction {
        Reduction::None => losses,
        Reduction::Sum => losses.sum_all()?,
        Reduction::Mean => mean_over(&losses, out.total_weight)?,
    })
}

/// `Σ losses / total_weight` on the losses' device (the denominator is a one-element `F64`
/// storage there, so nothing waits). 16-bit losses are summed and divided in f32 and rounded
/// once, so a large batch cannot overflow the sum.
fn mean_over(losses: &Tensor, total_weight: kiln_device::Storage) -> Result<Tensor> {
    let dtype = losses.dtype();
    let compute = if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let total = Tensor::from_storage_contiguous(total_weight, &[])?.to_dtype(compute)?;
    Ok(losses
        .to_dtype(compute)?
        .sum_all()?
        .div(&total)?
        .to_dtype(dtype)?)
}

/// PyTorch's `torch.nn.functional.nll_loss`: log-probabilities `[N, C, d1, ...]` (or `[C]`)
/// against class indices `[N, d1, ...]` (or `[]`). Gradients flow to the input.
pub fn nll_loss(input: &Tensor, target: &Tensor, options: &NllLossOptions<'_>) -> Result<Tensor> {
    const OP: &str = "nll_loss";
    let classes = check_logits(OP, input, "log-probabilities")?;
    check_class_targets(OP, input, target, false)?;
    check_weight(OP, input, options.weight, classes)?;
    if input.rank() == 1 {
        let out = nll_loss(&input.unsqueeze(0)?, &target.unsqueeze(0)?, options)?;
        return match options.reduction {
            Reduction::None => Ok(out.squeeze_dim(0)?),
            _ => Ok(out),
        };
    }
    let ignore = options.ignore_index;
    if input.device().is_cpu() {
        // Reading CPU labels costs nothing: report the first bad target with its position now.
        // On a device the gather below checks the indices there (no synchronisation); a bad
        // one is reported by kiln-device at the next synchronisation (see docs/GUIDE.md).
        let labels = labels_to_host(OP, target)?;
        if let Some(flat) = labels
            .iter()
            .position(|&y| y != ignore && (y < 0 || y as u64 >= classes as u64))
        {
            return Err(Error::TargetOutOfRange {
                op: OP,
                value: labels[flat],
                position: unravel(flat, target.shape()),
                classes,
                ignore: ignore_text(ignore),
            });
        }
    } else {
        check_label_dtype(OP, target)?;
    }
    // Everything below runs on the input's device: ignored positions gather class 0, and both
    // what they gather and their weight are then replaced by 0 (not multiplied by it, so a NaN
    // or infinity in class 0 or in w[0] cannot reach an ignored position's loss or the mean's
    // denominator). The loss is -w[y] * input[n, y, d].
    let labels = target.to_dtype(DType::I64)?;
    let ignored = labels.eq_scalar(ignore as f64)?;
    let safe = labels.masked_fill(&ignored, 0.0)?;
    let picked = input
        .gather(1, &safe.unsqueeze(1)?)?
        .squeeze_dim(1)?
        .masked_fill(&ignored, 0.0)?;
    let weights = match options.weight {
        Some(w) => w
            .index_select(0, &safe.flatten(0, -1)?)?
            .reshape_to(safe.shape())?
            .masked_fill(&ignored, 0.0)?,
        None => ignored.logical_not()?.to_dtype(input.dtype())?,
    };
    let losses = picked.mul(&weights)?.neg()?;
    Ok(match options.reduction {
        Reduction::None => losses,
        Reduction::Sum => losses.sum_all()?,
        Reduction::Mean => losses.sum_all()?.div(&weights.sum_all()?)?,
    })
}
