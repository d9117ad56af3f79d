//! Target-form checks: the mix-ups between class indices and one-hot / probability vectors.
//!
//! Two families of losses want two different target forms:
//! - class-index losses (`cross_entropy`, `nll_loss`): one integer per position, shaped like the
//!   input without its class dim 1 (`[N]` for `[N, C]` logits); `cross_entropy` also takes float
//!   class probabilities shaped like the input;
//! - elementwise losses (`mse_loss`, `l1_loss`, ...): float values shaped exactly like the input.
//!
//! The classic mistakes each have a recognisable shape/dtype signature, checked here before any
//! kernel runs: integer targets shaped like the logits (one-hot vectors, for a class-index loss),
//! float targets shaped like the logits (one-hot or soft labels given to `nll_loss`), float
//! targets without the class dim (indices stored as floats), and integer or `[N]` targets given
//! to an elementwise loss with `[N, C]` inputs. Each error says which form the loss wants and
//! the conversion (`argmax`, `one_hot`, `to_dtype`).

use crate::error::{dtype_err, form_err, shape_err};
use crate::Result;
use kiln_autograd::{DType, Tensor};
use kiln_device::ops::loss::TargetKind;

/// The shape of class-index targets for `input_shape`: the input without dim 1 (`[]` for an
/// unbatched `[C]` input).
pub(crate) fn index_shape(input_shape: &[usize]) -> Vec<usize> {
    match input_shape.len() {
        0 | 1 => vec![],
        _ => {
            let mut s = input_shape.to_vec();
            s.remove(1);
            s
        }
    }
}

fn is_integer(dtype: DType) -> bool {
    matches!(dtype, DType::I64 | DType::U8)
}

/// Requires float input with a class dim (rank >= 1).
pub(crate) fn check_logits(op: &'static str, input: &Tensor, what: &str) -> Result<usize> {
    if !input.dtype().is_float() {
        return Err(dtype_err(
            op,
            format!(
                "the input ({what}) must be floating point, got {}; convert with \
                 to_dtype(DType::F32)",
                input.dtype()
            ),
        ));
    }
    if input.rank() == 0 {
        return Err(shape_err(
            op,
            format!(
                "the input ({what}) needs a class dim: shape [C] or [N, C, d1, ...], got a 0-d \
                 tensor"
            ),
        ));
    }
    let class_dim = usize::from(input.rank() > 1);
    let classes = input.shape()[class_dim];
    if classes == 0 {
        // PyTorch returns 0 (or NaN with label smoothing) when every target is ignored; any
        // other target is out of range. Neither is a loss worth training on.
        return Err(shape_err(
            op,
            format!(
                "the input ({what}) of shape {:?} has no classes: its class dim {class_dim} is \
                 empty; pass one score per class (at least one class)",
                input.shape()
            ),
        ));
    }
    Ok(classes)
}

/// Classifies the targets of a class-index loss, or explains the mix-up. `probabilities`: the
/// loss also accepts float class probabilities shaped like the input (`cross_entropy`).
pub(crate) fn check_class_targets(
    op: &'static str,
    input: &Tensor,
    target: &Tensor,
    probabilities: bool,
) -> Result<TargetKind> {
    let (ishape, tshape) = (input.shape(), target.shape());
    let want = index_shape(ishape);
    let classes = if ishape.len() == 1 {
        ishape[0]
    } else {
        ishape[1]
    };
    let argmax_dim = if ishape.len() == 1 { 0 } else { 1 };
    let soft = if probabilities {
        format!(" or float class probabilities of the input's shape {ishape:?}")
    } else {
        String::new()
    };
    let mismatch = || {
        shape_err(
            op,
            format!(
                "target shape {tshape:?} does not fit input shape {ishape:?}: {op} wants class \
                 indices of shape {want:?} (the input's shape without the class dim){soft}"
            ),
        )
    };
    match target.dtype() {
        dt if is_integer(dt) => {
            if tshape == want.as_slice() {
                Ok(TargetKind::Indices)
            } else if tshape == ishape {
                let alt = if probabilities {
                    format!(
                        ", or float class probabilities of shape {ishape:?} (convert with \
                         target.to_dtype(DType::F32))"
                    )
                } else {
                    String::new()
                };
                Err(form_err(
                    op,
                    format!(
                        "got {dt} targets of shape {tshape:?}, the input's own shape: these look \
                         like one-hot vectors, but {op} wants class indices of shape {want:?}, one \
                         per position (convert with target.argmax({argmax_dim}, false)){alt}"
                    ),
                ))
            } else {
                Err(mismatch())
            }
        }
        DType::Bool => Err(dtype_err(
            op,
            format!(
                "got bool targets; {op} wants int64 class indices of shape {want:?} (convert with \
                 to_dtype(DType::I64)){soft}"
            ),
        )),
        dt => {
            if probabilities && tshape == ishape {
                if dt != input.dtype() {
                    return Err(dtype_err(
                        op,
                        format!(
                            "class-probability targets must have the input's dtype {}, got {dt}; \
                             convert with to_dtype(DType::{:?})",
                            input.dtype(),
                            input.dtype()
                        ),
                    ));
                }
                Ok(TargetKind::Probabilities)
            } else if tshape == want.as_slice() {
                Err(form_err(
                    op,
                    format!(
                        "got {dt} targets of shape {tshape:?}: these look like class indices \
                         stored as floats, but {op} wants integer class indices; convert with \
                         target.to_dtype(DType::I64)"
                    ),
                ))
            } else if tshape == ishape {
                Err(form_err(
                    op,
                    format!(
                        "got {dt} targets of shape {tshape:?}, the input's own shape: these look \
                         like one-hot vectors or class probabilities, but {op} wants integer class \
                         indices of shape {want:?} (convert one-hot vectors with \
                         target.argmax({argmax_dim}, false)); for soft labels use cross_entropy on \
                         logits, which takes class probabilities of {classes} classes"
                    ),
                ))
            } else {
                Err(mismatch())
            }
        }
    }
}

/// Checks the target of an elementwise loss: float, the input's dtype and shape.
pub(crate) fn check_elementwise_target(
    op: &'static str,
    input: &Tensor,
    target: &Tensor,
) -> Result<()> {
    let (ishape, tshape) = (input.shape(), target.shape());
    if !input.dtype().is_float() {
        return Err(dtype_err(
            op,
            format!(
                "the input must be floating point, got {}; convert with to_dtype(DType::F32)",
                input.dtype()
            ),
        ));
    }
    // `[N]` targets for `[N, C]` input: class indices where values shaped like the input belong.
    let looks_like_indices = ishape.len() >= 2 && tshape == index_shape(ishape).as_slice();
    let classes = ishape.get(1).copied().unwrap_or(0);
    let fix_indices = |dt: DType| {
        let to_long = if dt == DType::I64 {
            "target"
        } else {
            "&target.to_dtype(DType::I64)?"
        };
        form_err(
            op,
            format!(
                "got {dt} targets of shape {tshape:?} for input {ishape:?}: these look like class \
                 indices, but {op} compares values elementwise and needs float targets of the \
                 input's shape {ishape:?}, e.g. one-hot vectors; convert with \
                 one_hot({to_long}, Some({classes}))?.to_dtype(DType::{:?}) (or, for class \
                 indices, use cross_entropy / nll_loss instead)",
                input.dtype()
            ),
        )
    };
    if looks_like_indices && classes == 1 {
        return Err(shape_err(
            op,
            format!(
                "input shape {ishape:?} and target shape {tshape:?} differ (the target lacks the \
                 size-1 dim 1); pass target.unsqueeze(1) or input.squeeze_dim(1) so both have one \
                 shape"
            ),
        ));
    }
    if looks_like_indices {
        return Err(fix_indices(target.dtype()));
    }
    if tshape != ishape {
        return Err(shape_err(
            op,
            format!(
                "input shape {ishape:?} and target shape {tshape:?} differ; pass a target of the \
                 input's shape (kiln's elementwise losses do not broadcast targets: PyTorch only \
                 warns, and the broadcast result is nearly always a bug)"
            ),
        ));
    }
    if target.dtype() != input.dtype() {
        return Err(dtype_err(
            op,
            format!(
                "got {} targets for {} input; {op} needs float targets of the input's dtype: \
                 convert with target.to_dtype(DType::{:?})",
                target.dtype(),
                input.dtype(),
                input.dtype()
            ),
        ));
    }
    Ok(())
}
