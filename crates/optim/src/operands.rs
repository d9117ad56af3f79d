//! Operands of kiln-device's multi-tensor ops, taken from tensors: the optimizer-side checks and
//! buffer guards every fused pass (clipping, unscaling, optimizer steps) shares.
//!
//! Invariants: a write operand is a contiguous tensor whose buffer no other tensor of the list
//! uses (each buffer is locked once, so two write guards never meet on one lock); tensors that
//! are strided views or share a buffer go through a dense copy that is written back afterwards,
//! so every tensor is updated exactly as if it were dense; gradients handed to an optimizer step
//! have the parameter's dtype and device and their own buffer. Nothing here names a device: the
//! multi-tensor ops check that a list is on one device and dispatch.

use crate::{Error, Result};
use kiln_autograd::{DType, Device, Parameter, Tensor};
use kiln_device::ops::multi_tensor::{Operand, OperandMut};
use std::borrow::Cow;

/// Marks the tensors of `list` whose buffers no other tensor in the list uses. The buffer keys
/// are sorted (no hashing per tensor); only when two are equal are the tensors holding them
/// looked for.
fn unshared(list: &[Tensor]) -> Vec<bool> {
    let mut keys: Vec<usize> = list.iter().map(Tensor::storage_key).collect();
    keys.sort_unstable();
    let mut shared: Vec<usize> = keys
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    if shared.is_empty() {
        return vec![true; list.len()];
    }
    shared.dedup();
    list.iter()
        .map(|t| shared.binary_search(&t.storage_key()).is_err())
        .collect()
}

/// Runs `f` once over read operands of every tensor (one fused pass). Strided views are first
/// copied into dense tensors; dense ones are borrowed, not cloned (a clone per tensor was a
/// tenth of a clip over thousands of small gradients).
pub(crate) fn with_operands<R>(
    tensors: &[Tensor],
    f: impl FnOnce(&[Operand<'_>]) -> Result<R>,
) -> Result<R> {
    let work: Vec<Cow<'_, Tensor>> = tensors
        .iter()
        .map(|t| {
            if t.is_contiguous() {
                Ok(Cow::Borrowed(t))
            } else {
                kiln_autograd::no_grad(|| t.contiguous()).map(Cow::Owned)
            }
        })
        .collect::<Result<_, _>>()?;
    let guards: Vec<_> = work.iter().map(|t| t.storage_read()).collect();
    let operands: Vec<Operand<'_>> = guards
        .iter()
        .zip(&work)
        .map(|(g, t)| (&**g, t.layout()))
        .collect();
    f(&operands)
}

/// Runs `f` once over write operands of every tensor (one fused pass). Strided views and
/// tensors sharing a buffer with another in the list go through a dense copy that is written
/// back afterwards.
pub(crate) fn with_operands_mut<R>(
    tensors: &[Tensor],
    f: impl FnOnce(&mut [OperandMut<'_>]) -> Result<R>,
) -> Result<R> {
    with_operands_maybe_mut(tensors, |ops| Ok((f(ops)?, Wrote::Yes)))
}

/// Whether a pass over write operands wrote them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wrote {
    /// The tensors changed: their versions are bumped, dense copies written back.
    Yes,
    /// Nothing was written: versions stay, copies are dropped.
    No,
}

/// [`with_operands_mut`] for a pass that may turn out to write nothing (a clip whose
/// coefficient is 1): the buffers are locked for writing without marking them changed, and
/// only when `f` reports [`Wrote::Yes`] (or fails part-way) are their versions bumped and the
/// dense copies written back, so an untouched list reads as untouched to saved-tensor checks.
pub(crate) fn with_operands_maybe_mut<R>(
    tensors: &[Tensor],
    f: impl FnOnce(&mut [OperandMut<'_>]) -> Result<(R, Wrote)>,
) -> Result<R> {
    let alone = unshared(tensors);
    let mut copies: Vec<(usize, Tensor)> = Vec::new();
    let mut work: Vec<Cow<'_, Tensor>> = Vec::with_capacity(tensors.len());
    for (i, t) in tensors.iter().enumerate() {
        if t.is_contiguous() && alone[i] {
            work.push(Cow::Borrowed(t));
        } else {
            let c = kiln_autograd::no_grad(|| t.copy_data())?;
            copies.push((i, c.clone()));
            work.push(Cow::Owned(c));
        }
    }
    let outcome = kiln_autograd::no_grad(|| -> Result<Result<(R, Wrote)>> {
        let mut guards = work
            .iter()
            .map(|t| t.storage_write_unmarked())
            .collect::<Result<Vec<_>, _>>()?;
        let mut operands: Vec<OperandMut<'_>> = guards
            .iter_mut()
            .zip(&work)
            .map(|(g, t)| (&mut **g, t.layout()))
            .collect();
        Ok(f(&mut operands))
    })?;
    // A pass that failed may have written part of the list: count it as written.
    if !matches!(outcome, Ok((_, Wrote::No))) {
        work.iter().for_each(|t| t.mark_written());
    }
    let (result, wrote) = outcome?;
    if wrote == Wrote::Yes {
        kiln_autograd::no_grad(|| -> Result<()> {
            for (i, c) in copies {
                tensors[i].copy_(&c)?;
            }
            Ok(())
        })?;
    }
    Ok(result)
}

/// Splits `items` by device, in order of first appearance (each device's list is one fused
/// pass of the multi-tensor ops, which take one device per list).
pub(crate) fn by_device<T>(items: impl IntoIterator<Item = (Device, T)>) -> Vec<Vec<T>> {
    let mut devices: Vec<Device> = Vec::new();
    let mut lists: Vec<Vec<T>> = Vec::new();
    for (device, item) in items {
        match devices.iter().position(|&d| d == device) {
            Some(i) => lists[i].push(item),
            None => {
                devices.push(device);
                lists.push(vec![item]);
            }
        }
    }
    lists
}

fn unsupported(op: &'static str, msg: String) -> Error {
    Error::Unsupported { op, msg }
}

/// The gradient of `item`, checked for a fused step: on the host, the parameter is a dense
/// f32/f64 tensor and the gradient has its dtype and its own buffer (a strided gradient is made
/// contiguous); on a device, both are contiguous f32 tensors on the parameter's device.
pub(crate) fn checked_grad(
    op: &'static str,
    name: &str,
    p: &Parameter,
    g: Tensor,
) -> Result<Tensor> {
    if !p.device().is_cpu() {
        if p.dtype() != DType::F32 || g.dtype() != DType::F32 {
            return Err(unsupported(
                "step",
                format!(
                    "{op}: parameter `{}` on {} and its gradient must be f32 (got {} and {}); \
                     keep master weights in f32",
                    name,
                    p.device(),
                    p.dtype(),
                    g.dtype()
                ),
            ));
        }
        if g.device() != p.device() || !p.is_contiguous() || !g.is_contiguous() {
            return Err(unsupported(
                "step",
                format!(
                    "{op}: parameter `{}` on {} and its gradient must be contiguous and on the \
                     same device",
                    name,
                    p.device()
                ),
            ));
        }
        return Ok(g);
    }
    if !p.is_contiguous() {
        return Err(unsupported(
            op,
            format!(
                "parameter `{}` is not a dense host tensor (strided on {}); the fused step \
                 updates contiguous CPU parameters: make it contiguous, or step it on the CPU",
                name,
                p.device()
            ),
        ));
    }
    if !matches!(p.dtype(), DType::F32 | DType::F64) {
        return Err(unsupported(
            op,
            format!(
                "parameter `{}` is {}; optimizers update f32/f64 parameters: keep master weights \
                 in f32 (mixed precision keeps f16/bf16 only for activations)",
                name,
                p.dtype()
            ),
        ));
    }
    if g.dtype() != p.dtype() {
        return Err(unsupported(
            op,
            format!(
                "gradient of `{}` is {} but the parameter is {}; set a gradient of the \
                 parameter's dtype",
                name,
                g.dtype(),
                p.dtype()
            ),
        ));
    }
    if g.shares_storage_with(p) {
        return Err(unsupported(
            op,
            format!(
                "gradient of `{}` shares the parameter's buffer; give it its own",
                name
            ),
        ));
    }
    if g.is_contiguous() && g.device().is_cpu() {
        Ok(g)
    } else {
        Ok(kiln_autograd::no_grad(|| g.contiguous())?)
    }
}
