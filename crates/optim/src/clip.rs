//! Gradient clipping: PyTorch's `clip_grad_norm_`, `get_total_norm`, `clip_grads_with_norm_` and
//! `clip_grad_value_`, on the fused multi-tensor ops of `kiln-device` (the same calls for CPU
//! and CUDA gradients; a list mixing devices is an error).
//!
//! `clip_grad_norm_` is two passes over the gradient list whatever its length: one parallel read
//! computing every tensor's norm (fixed chunking, so the result is bitwise identical for any
//! thread count), and a scale pass that runs only when the coefficient is below 1; the
//! gradients' buffers are locked once for both. Semantics
//! follow PyTorch exactly: parameters without a gradient are skipped; the total is the norm of
//! the per-tensor norms; `coef = min(max_norm / (total + 1e-6), 1)`; a NaN or infinite total
//! scales the gradients by a NaN or zero coefficient, as PyTorch does, unless
//! `error_if_nonfinite`, which returns an error naming the first offending parameter instead.
//! [`clip_coef_for`] computes the total and the coefficient without scaling, so the optimizer
//! can apply it while it reads the gradients ([`crate::Optimizer::step_with_grad_scale`]).
//! A NaN or negative `max_norm` / `clip_value` is an error before any gradient is touched
//! (PyTorch would silently flip or NaN the gradients). The infinity norms (`norm_type` ±inf)
//! of a gradient with no elements are an error, as in PyTorch (max and min have no identity);
//! an empty list, or parameters without gradients, give a total of 0 for every `norm_type`, as
//! in PyTorch.
//!
//! Every function takes a slice of named parameters (`named_parameters()`) or of bare
//! [`Parameter`]s (`parameters()`, named `param[i]` in errors): see [`ParamEntry`].

use crate::group::ParamEntry;
use crate::operands::{with_operands, with_operands_maybe_mut, with_operands_mut, Wrote};
use crate::{arg_err, Error, Result};
use kiln_autograd::{DType, Device, Parameter, Tensor};
use kiln_device::ops::multi_tensor::{self, GlobalNorm, NormKind};

pub use kiln_device::ops::multi_tensor::clip_coef;

/// Names parameters that have none: `"param[0]"`, `"param[1]"`, ... (no longer needed: every
/// function here and [`crate::ParamGroup`] take bare parameters too).
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

/// Rejects a `max_norm` that is NaN or negative: either would rewrite every gradient (NaN, or
/// flipped in sign) instead of clipping it. Zero and infinity are valid (zero gradients, no-op).
fn check_max_norm(op: &'static str, max_norm: f64) -> Result<()> {
    if max_norm.is_nan() || max_norm < 0.0 {
        return Err(arg_err(
            op,
            format!(
                "max_norm is {max_norm:?}; pass a non-negative number (1.0 is common; \
                 f64::INFINITY only measures the norm)"
            ),
        ));
    }
    Ok(())
}

/// The name of the i-th tensor of a list, made only when an error needs it (a list of
/// thousands of gradients should not format thousands of strings per call).
type Names<'a> = &'a dyn Fn(usize) -> String;

/// The gradients present, with the index in `params` of each (parameters without one are
/// skipped).
fn grads_of<P: ParamEntry>(params: &[P]) -> (Vec<usize>, Vec<Tensor>) {
    params
        .iter()
        .enumerate()
        .filter_map(|(i, p)| p.parameter().grad().map(|g| (i, g)))
        .unzip()
}

/// The names of the parameters behind `grads_of`'s indices.
fn names_of<'a, P: ParamEntry>(
    params: &'a [P],
    index: &'a [usize],
) -> impl Fn(usize) -> String + 'a {
    move |k| params[index[k]].name(index[k])
}

/// `"tensor[i]"`, the names of a bare tensor list.
fn tensor_name(i: usize) -> String {
    format!("tensor[{i}]")
}

/// Refuses the norms that have no value for a tensor with no elements, as PyTorch does: the
/// infinity norms (the largest or smallest absolute value of nothing) and the negative-`p`
/// norms (`(sum |x|^p)^(1/p)` of nothing is `0^(1/p)`, the identity-less `1/0`).
fn check_norm_of_empty(
    op: &'static str,
    names: Names<'_>,
    tensors: &[Tensor],
    kind: NormKind,
) -> Result<()> {
    let which = match kind {
        NormKind::Inf => "infinity".to_string(),
        NormKind::NegInf => "-infinity".to_string(),
        NormKind::P(p) if p < 0.0 => format!("{p}"),
        _ => return Ok(()),
    };
    match tensors.iter().position(|t| t.numel() == 0) {
        None => Ok(()),
        Some(i) => Err(arg_err(
            op,
            format!(
                "{} has no elements, and the {which} norm of an empty tensor is undefined (it \
                 has no identity; PyTorch raises too); leave that parameter out, or pass a \
                 norm_type >= 0 such as 2.0",
                names(i)
            ),
        )),
    }
}

/// The norm of each tensor, in one fused pass (host tensors).
pub fn per_tensor_norms(tensors: &[Tensor], norm_type: f64) -> Result<Vec<f64>> {
    let kind = norm_kind("get_total_norm", norm_type)?;
    check_norm_of_empty("get_total_norm", &tensor_name, tensors, kind)?;
    with_operands(tensors, |ops| {
        Ok(multi_tensor::per_tensor_norms("get_total_norm", ops, kind)?)
    })
}

/// The norm of the per-tensor norms of `tensors` (PyTorch's `torch.nn.utils.get_total_norm`);
/// 0 for an empty list. With `error_if_nonfinite`, a NaN/infinite total is an error naming the
/// first tensor (`"tensor[i]"`) whose norm is non-finite.
pub fn get_total_norm(tensors: &[Tensor], norm_type: f64, error_if_nonfinite: bool) -> Result<f64> {
    total_norm_named(&tensor_name, tensors, norm_type, error_if_nonfinite)
}

fn total_norm_named(
    names: Names<'_>,
    tensors: &[Tensor],
    norm_type: f64,
    error_if_nonfinite: bool,
) -> Result<f64> {
    let kind = norm_kind("clip_grad_norm_", norm_type)?;
    if tensors.is_empty() {
        return Ok(0.0);
    }
    check_norm_of_empty("clip_grad_norm_", names, tensors, kind)?;
    let norm = checked_global_norm(
        names,
        tensors,
        kind,
        norm_type,
        f64::INFINITY,
        error_if_nonfinite,
    )?;
    Ok(norm.total()?)
}

/// The [`GlobalNorm`] of `tensors` (one read pass, kept on their device); with
/// `error_if_nonfinite`, a NaN/infinite total is an error naming the first tensor whose norm is
/// non-finite (for device tensors that error path computes the norms again on host copies).
fn checked_global_norm(
    names: Names<'_>,
    tensors: &[Tensor],
    kind: NormKind,
    norm_type: f64,
    max_norm: f64,
    error_if_nonfinite: bool,
) -> Result<GlobalNorm> {
    let norm = with_operands(tensors, |ops| {
        Ok(multi_tensor::global_norm(
            "clip_grad_norm_",
            ops,
            kind,
            max_norm,
        )?)
    })?;
    if !error_if_nonfinite {
        return Ok(norm);
    }
    let total = norm.total()?;
    if total.is_finite() {
        return Ok(norm);
    }
    let norms = match norm.per_tensor() {
        Some(norms) => norms.to_vec(),
        None => {
            let host: Vec<Tensor> = tensors
                .iter()
                .map(|t| t.to_device(Device::Cpu))
                .collect::<Result<_, _>>()?;
            per_tensor_norms(&host, norm_type)?
        }
    };
    let first = norms.iter().position(|n| !n.is_finite());
    Err(Error::NonFiniteNorm {
        norm_type,
        total,
        name: first.map_or_else(|| "(none: the total overflowed)".into(), names),
    })
}

/// Multiplies every gradient by `min(max_norm / (total_norm + 1e-6), 1)`; skips the pass when
/// that is exactly 1 (PyTorch's `clip_grads_with_norm_`).
pub fn clip_grads_with_norm_<P: ParamEntry>(
    params: &[P],
    max_norm: f64,
    total_norm: f64,
) -> Result<()> {
    check_max_norm("clip_grads_with_norm_", max_norm)?;
    let (_, grads) = grads_of(params);
    scale_grads(&grads, clip_coef(max_norm, total_norm))
}

/// Multiplies every tensor by `coef` in one fused pass, or does nothing when `coef >= 1`
/// (a NaN coefficient scales, as in PyTorch).
pub fn scale_grads(grads: &[Tensor], coef: f64) -> Result<()> {
    if coef >= 1.0 || grads.is_empty() {
        return Ok(());
    }
    with_operands_mut(grads, |ops| {
        Ok(multi_tensor::scale_("clip_grads_with_norm_", ops, coef)?)
    })
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
pub fn clip_coef_for<P: ParamEntry>(
    params: &[P],
    max_norm: f64,
    norm_type: f64,
    error_if_nonfinite: bool,
) -> Result<ClipInfo> {
    check_max_norm("clip_coef_for", max_norm)?;
    let (index, grads) = grads_of(params);
    let total_norm = total_norm_named(
        &names_of(params, &index),
        &grads,
        norm_type,
        error_if_nonfinite,
    )?;
    Ok(ClipInfo {
        total_norm,
        coef: clip_coef(max_norm, total_norm),
    })
}

/// The norm pass and, unless the coefficient is known to be `>= 1` on the host, the scale pass
/// (on a device the scale kernel reads the coefficient there and skips itself), over one set
/// of write guards: each gradient's buffer is locked once for both passes (a list of
/// thousands of small gradients spent a tenth of a clip locking them a second time), and
/// marked changed only when the scale pass ran. For CPU
/// gradients both run in one hand-over to kiln's pool, so the scale pass starts in place
/// instead of waking the pool a second time. A non-finite total under `error_if_nonfinite`
/// leaves the gradients alone and is reported by [`checked_global_norm`], which names the
/// tensor.
fn clip_by_global_norm(
    names: Names<'_>,
    grads: &[Tensor],
    kind: NormKind,
    norm_type: f64,
    max_norm: f64,
    error_if_nonfinite: bool,
) -> Result<GlobalNorm> {
    check_norm_of_empty("clip_grad_norm_", names, grads, kind)?;
    let device = grads.first().map_or(Device::Cpu, Tensor::device);
    let (norm, refused) = kiln_autograd::on_cpu_pool(device, || {
        with_operands_maybe_mut(grads, |ops| {
            let (norm, refused) = multi_tensor::clip_by_global_norm_(
                "clip_grad_norm_",
                ops,
                kind,
                max_norm,
                error_if_nonfinite,
            )?;
            let wrote = if refused || norm.host_coef().is_some_and(|coef| coef >= 1.0) {
                Wrote::No
            } else {
                Wrote::Yes
            };
            Ok(((norm, refused), wrote))
        })
    })?;
    if refused {
        return checked_global_norm(names, grads, kind, norm_type, max_norm, true);
    }
    Ok(norm)
}

/// Clips the gradients of `params` by their global `norm_type`-norm to at most `max_norm`,
/// in place, and returns the total norm before clipping (PyTorch's `clip_grad_norm_`).
pub fn clip_grad_norm_<P: ParamEntry>(
    params: &[P],
    max_norm: f64,
    norm_type: f64,
    error_if_nonfinite: bool,
) -> Result<f64> {
    check_max_norm("clip_grad_norm_", max_norm)?;
    let (index, grads) = grads_of(params);
    let kind = norm_kind("clip_grad_norm_", norm_type)?;
    if grads.is_empty() {
        return Ok(0.0);
    }
    let norm = clip_by_global_norm(
        &names_of(params, &index),
        &grads,
        kind,
        norm_type,
        max_norm,
        error_if_nonfinite,
    )?;
    Ok(norm.total()?)
}

/// [`clip_grad_norm_`] returning the total norm as a 0-d f32 tensor on the gradients' device
/// (PyTorch's return type) instead of an `f64`, so that on a CUDA device the call only queues
/// its two launches and a 4-byte copy, and never waits for the device (unless
/// `error_if_nonfinite`, whose check needs the value on the host). Prefer it in a CUDA training
/// loop that does not look at the norm every step (log it every N steps with `item()`, which
/// waits then); [`clip_grad_norm_`]'s `f64` costs one synchronisation per call. On the CPU the
/// result is a 0-d CPU tensor holding `clip_grad_norm_`'s total rounded to f32; with no
/// gradients it is a CPU zero. Gradients are clipped exactly as by [`clip_grad_norm_`].
pub fn clip_grad_norm_on_device<P: ParamEntry>(
    params: &[P],
    max_norm: f64,
    norm_type: f64,
    error_if_nonfinite: bool,
) -> Result<Tensor> {
    check_max_norm("clip_grad_norm_", max_norm)?;
    let (index, grads) = grads_of(params);
    let kind = norm_kind("clip_grad_norm_", norm_type)?;
    if grads.is_empty() {
        return Ok(Tensor::scalar(0.0, DType::F32, Device::Cpu)?);
    }
    let norm = clip_by_global_norm(
        &names_of(params, &index),
        &grads,
        kind,
        norm_type,
        max_norm,
        error_if_nonfinite,
    )?;
    let out = Tensor::zeros(&[], DType::F32, norm.device())?;
    kiln_autograd::no_grad(|| -> Result<()> {
        let mut guard = out.storage_write()?;
        Ok(norm.copy_total_into("clip_grad_norm_on_device", (&mut *guard, out.layout()))?)
    })?;
    Ok(out)
}

/// Clamps every gradient element to `[-clip_value, clip_value]` (PyTorch's `clip_grad_value_`).
pub fn clip_grad_value_<P: ParamEntry>(params: &[P], clip_value: f64) -> Result<()> {
    if clip_value.is_nan() || clip_value < 0.0 {
        return Err(arg_err(
            "clip_grad_value_",
            format!(
                "clip_value is {clip_value:?}; pass a non-negative number (gradients are clamped \
                 to [-clip_value, clip_value])"
            ),
        ));
    }
    let (_, grads) = grads_of(params);
    if grads.is_empty() {
        return Ok(());
    }
    with_operands_mut(&grads, |ops| {
        Ok(multi_tensor::clamp_("clip_grad_value_", ops, clip_value)?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(grads: &[&[f32]]) -> Vec<(String, Parameter)> {
        grads
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let p = Parameter::new(Tensor::zeros(&[g.len()], DType::F32, Device::Cpu).unwrap())
                    .unwrap();
                p.set_grad(Some(
                    Tensor::from_vec(g.to_vec(), &[g.len()], Device::Cpu).unwrap(),
                ))
                .unwrap();
                (format!("p{i}"), p)
            })
            .collect()
    }

    fn grads(ps: &[(String, Parameter)]) -> Vec<Vec<f32>> {
        ps.iter()
            .map(|(_, p)| p.grad().unwrap().to_vec::<f32>().unwrap())
            .collect()
    }

    #[test]
    fn on_device_total_equals_clip_grad_norm_and_clips_the_same() {
        let values: [&[f32]; 3] = [&[3.0, 0.0, 1.5], &[0.0, 4.0], &[-0.25; 7]];
        // Not clipping (10 > total), clipping (1 < total), infinity norm, p = 1.
        for (max_norm, norm_type) in [(10.0, 2.0), (1.0, 2.0), (0.5, f64::INFINITY), (2.0, 1.0)] {
            let (a, b) = (params(&values), params(&values));
            let want = clip_grad_norm_(&a, max_norm, norm_type, false).unwrap();
            let got = clip_grad_norm_on_device(&b, max_norm, norm_type, false).unwrap();
            assert_eq!(got.shape(), &[] as &[usize]);
            assert_eq!((got.dtype(), got.device()), (DType::F32, Device::Cpu));
            assert_eq!(got.to_vec::<f32>().unwrap(), vec![want as f32]);
            assert_eq!(grads(&a), grads(&b), "max_norm {max_norm}, p {norm_type}");
        }
        // The 2-norm here is sqrt(9 + 2.25 + 16 + 7 / 16) = 5.2678...; clipping to 1 scales.
        let c = params(&values);
        let total = clip_grad_norm_on_device(&c, 1.0, 2.0, false).unwrap();
        let want = (9.0f64 + 2.25 + 16.0 + 7.0 / 16.0).sqrt();
        assert_eq!(total.item().unwrap(), f64::from(want as f32));
        assert_eq!(grads(&c)[1][1], 4.0 * (1.0 / (want + 1e-6)) as f32);
    }

    #[test]
    fn on_device_reports_nonfinite_norms_and_is_zero_without_gradients() {
        let ps = params(&[&[1.0, 2.0], &[f32::NAN]]);
        let err = clip_grad_norm_on_device(&ps, 1.0, 2.0, true).unwrap_err();
        assert!(
            matches!(&err, Error::NonFiniteNorm { name, .. } if name == "p1"),
            "{err}"
        );
        let none = Parameter::new(Tensor::zeros(&[2], DType::F32, Device::Cpu).unwrap()).unwrap();
        let zero = clip_grad_norm_on_device(&[("n".into(), none)], 1.0, 2.0, true).unwrap();
        assert_eq!(zero.to_vec::<f32>().unwrap(), vec![0.0]);
        assert!(clip_grad_norm_on_device(&ps, 1.0, f64::NAN, false).is_err());
    }

    #[test]
    fn negative_or_nan_limits_are_errors_that_leave_the_gradients_alone() {
        let values: [&[f32]; 2] = [&[3.0, -4.0], &[0.5]];
        for bad in [-1.0, f64::NAN, f64::NEG_INFINITY] {
            let ps = params(&values);
            let errs = [
                clip_grad_norm_(&ps, bad, 2.0, false).map(|_| ()),
                clip_grad_norm_on_device(&ps, bad, 2.0, false).map(|_| ()),
                clip_coef_for(&ps, bad, 2.0, false).map(|_| ()),
                clip_grads_with_norm_(&ps, bad, 5.0),
            ];
            for err in errs {
                let err = err.unwrap_err();
                assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
                assert!(err.to_string().contains("max_norm is"), "{err}");
            }
            let err = clip_grad_value_(&ps, bad).unwrap_err();
            assert!(err.to_string().contains("clip_value is"), "{err}");
            assert_eq!(grads(&ps), vec![vec![3.0, -4.0], vec![0.5]]);
        }
        // Zero is a valid limit for both: every gradient becomes zero.
        let ps = params(&values);
        clip_grad_value_(&ps, 0.0).unwrap();
        assert_eq!(grads(&ps), vec![vec![0.0, 0.0], vec![0.0]]);
    }
}
