//! Gradient clipping: PyTorch's `clip_grad_norm_`, `get_total_norm`, `clip_grads_with_norm_` and
//! `clip_grad_value_`, on the fused multi-tensor kernels of `kiln-device`.
//!
//! `clip_grad_norm_` is two passes over the gradient list whatever its length: one parallel read
//! computing every tensor's norm (fixed chunking, so the result is bitwise identical for any
//! thread count), and a scale pass that runs only when the coefficient is below 1. Semantics
//! follow PyTorch exactly: parameters without a gradient are skipped; the total is the norm of
//! the per-tensor norms; `coef = min(max_norm / (total + 1e-6), 1)`; a NaN or infinite total
//! scales the gradients by a NaN or zero coefficient, as PyTorch does, unless
//! `error_if_nonfinite`, which returns an error naming the first offending parameter instead.
//! [`clip_coef_for`] computes the total and the coefficient without scaling, so the optimizer
//! can apply it while it reads the gradients ([`crate::Optimizer::step_with_grad_scale`]).

use crate::access::{with_slices, with_slices_mut};
use crate::{arg_err, Error, Result};
use kiln_autograd::{Parameter, Tensor};
use kiln_device::ops::multi_tensor::{cpu, NormKind};

pub use kiln_device::ops::multi_tensor::clip_coef;

/// Names parameters that have none: `"param[0]"`, `"param[1]"`, ...
pub fn unnamed(params: &[Parameter]) -> Vec<(String, Parameter)> {
    params
        .iter()
        .enumerate()
        .map(|(i, p)| (format!("param[{i}]"), p.clone()))
        .collect()
}

fn norm_kind(op: &'static str, norm_type: f64) -> Result<NormKind> {
    NormKind::from_norm_type(norm_type).ok_or_else(|| {
        arg_err(
            op,
            "norm_type is NaN; pass 2.0 (Euclidean), 1.0, f64::INFINITY or another p",
        )
    })
}

/// The gradients present, with their parameter names (parameters without one are skipped).
fn grads_of(params: &[(String, Parameter)]) -> (Vec<String>, Vec<Tensor>) {
    params
        .iter()
        .filter_map(|(n, p)| p.grad().map(|g| (n.clone(), g)))
        .unzip()
}

/// The norm of each tensor, in one fused pass.
pub fn per_tensor_norms(tensors: &[Tensor], norm_type: f64) -> Result<Vec<f64>> {
    let kind = norm_kind("get_total_norm", norm_type)?;
    with_slices("get_total_norm", tensors, |s| {
        cpu::per_tensor_norms(s, kind)
    })
}

/// The norm of the per-tensor norms of `tensors` (PyTorch's `torch.nn.utils.get_total_norm`);
/// 0 for an empty list. With `error_if_nonfinite`, a NaN/infinite total is an error naming the
/// first tensor (`"tensor[i]"`) whose norm is non-finite.
pub fn get_total_norm(tensors: &[Tensor], norm_type: f64, error_if_nonfinite: bool) -> Result<f64> {
    let names: Vec<String> = (0..tensors.len()).map(|i| format!("tensor[{i}]")).collect();
    total_norm_named(&names, tensors, norm_type, error_if_nonfinite)
}

fn total_norm_named(
    names: &[String],
    tensors: &[Tensor],
    norm_type: f64,
    error_if_nonfinite: bool,
) -> Result<f64> {
    let kind = norm_kind("clip_grad_norm_", norm_type)?;
    if tensors.is_empty() {
        return Ok(0.0);
    }
    let norms = per_tensor_norms(tensors, norm_type)?;
    let total = kind.norm_of(&norms);
    if error_if_nonfinite && !total.is_finite() {
        let first = norms.iter().position(|n| !n.is_finite());
        return Err(Error::NonFiniteNorm {
            norm_type,
            total,
            name: first.map_or_else(
                || "(none: the total overflowed)".into(),
                |i| names[i].clone(),
            ),
        });
    }
    Ok(total)
}

/// Multiplies every gradient by `min(max_norm / (total_norm + 1e-6), 1)`; skips the pass when
/// that is exactly 1 (PyTorch's `clip_grads_with_norm_`).
pub fn clip_grads_with_norm_(
    params: &[(String, Parameter)],
    max_norm: f64,
    total_norm: f64,
) -> Result<()> {
    let (_, grads) = grads_of(params);
    scale_grads(&grads, clip_coef(max_norm, total_norm))
}

/// Multiplies every tensor by `coef` in one fused pass, or does nothing when `coef >= 1`
/// (a NaN coefficient scales, as in PyTorch).
pub fn scale_grads(grads: &[Tensor], coef: f64) -> Result<()> {
    if coef >= 1.0 || grads.is_empty() {
        return Ok(());
    }
    with_slices_mut("clip_grads_with_norm_", grads, |s| cpu::scale_(s, coef))
}

/// The total norm and the clip coefficient of the gradients of `params`, without touching the
/// gradients: hand `coef` to [`crate::Optimizer::step_with_grad_scale`] to clip while stepping.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClipInfo {
    /// The total gradient norm (what `clip_grad_norm_` returns).
    pub total_norm: f64,
    /// `min(max_norm / (total_norm + 1e-6), 1)`.
    pub coef: f64,
}

/// Computes [`ClipInfo`] (one read pass; no scale pass).
pub fn clip_coef_for(
    params: &[(String, Parameter)],
    max_norm: f64,
    norm_type: f64,
    error_if_nonfinite: bool,
) -> Result<ClipInfo> {
    let (names, grads) = grads_of(params);
    let total_norm = total_norm_named(&names, &grads, norm_type, error_if_nonfinite)?;
    Ok(ClipInfo {
        total_norm,
        coef: clip_coef(max_norm, total_norm),
    })
}

/// Clips the gradients of `params` by their global `norm_type`-norm to at most `max_norm`,
/// in place, and returns the total norm before clipping (PyTorch's `clip_grad_norm_`).
pub fn clip_grad_norm_(
    params: &[(String, Parameter)],
    max_norm: f64,
    norm_type: f64,
    error_if_nonfinite: bool,
) -> Result<f64> {
    let (names, grads) = grads_of(params);
    if grads.is_empty() {
        norm_kind("clip_grad_norm_", norm_type)?;
        return Ok(0.0);
    }
    #[cfg(feature = "cuda")]
    if grads.iter().any(|g| !g.device().is_cpu()) {
        norm_kind("clip_grad_norm_", norm_type)?;
        return crate::clip_cuda::clip_grad_norm_cuda(
            &names,
            &grads,
            max_norm,
            norm_type,
            error_if_nonfinite,
        );
    }
    let total = total_norm_named(&names, &grads, norm_type, error_if_nonfinite)?;
    scale_grads(&grads, clip_coef(max_norm, total))?;
    Ok(total)
}

/// Clamps every gradient element to `[-clip_value, clip_value]` (PyTorch's `clip_grad_value_`).
pub fn clip_grad_value_(params: &[(String, Parameter)], clip_value: f64) -> Result<()> {
    if clip_value.is_nan() {
        return Err(arg_err(
            "clip_grad_value_",
            "clip_value is NaN; pass a positive number",
        ));
    }
    let (_, grads) = grads_of(params);
    if grads.is_empty() {
        return Ok(());
    }
    with_slices_mut("clip_grad_value_", &grads, |s| cpu::clamp_(s, clip_value))
}
