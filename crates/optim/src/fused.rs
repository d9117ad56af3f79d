//! Shared plumbing of the fused optimizer passes: checking and typing the tensors of one step,
//! and splitting them into the fixed chunks a parallel pass runs over.

use crate::access::{is_dense_host, OptFloat};
use crate::optimizer::StepItem;
use crate::{Error, Result};
use kiln_autograd::{DType, Tensor};

/// The elements per chunk of a fused optimizer pass (the multi-tensor kernels' chunk size).
pub(crate) const CHUNK: usize = kiln_device::ops::multi_tensor::CHUNK_ELEMS;

/// The gradient of `item`, dense and of the parameter's dtype, or an error saying what to fix.
pub(crate) fn checked_grad<S>(op: &'static str, item: &StepItem<'_, S>) -> Result<Tensor> {
    let p = item.param;
    if !is_dense_host(p) {
        return Err(Error::Unsupported {
            op,
            msg: format!(
                "parameter `{}` is not a dense host tensor ({} on {}); the fused step updates \
                 contiguous CPU parameters: make it contiguous, or step it on the CPU",
                item.name,
                if p.is_contiguous() {
                    "contiguous"
                } else {
                    "strided"
                },
                p.device()
            ),
        });
    }
    if !matches!(p.dtype(), DType::F32 | DType::F64) {
        return Err(Error::Unsupported {
            op,
            msg: format!(
                "parameter `{}` is {}; optimizers update f32/f64 parameters: keep master weights \
                 in f32 (mixed precision keeps f16/bf16 only for activations)",
                item.name,
                p.dtype()
            ),
        });
    }
    let g = &item.grad;
    if g.dtype() != p.dtype() {
        return Err(Error::Unsupported {
            op,
            msg: format!(
                "gradient of `{}` is {} but the parameter is {}; set a gradient of the \
                 parameter's dtype",
                item.name,
                g.dtype(),
                p.dtype()
            ),
        });
    }
    if g.shares_storage_with(p) {
        return Err(Error::Unsupported {
            op,
            msg: format!(
                "gradient of `{}` shares the parameter's buffer; give it its own",
                item.name
            ),
        });
    }
    if is_dense_host(g) {
        Ok(g.clone())
    } else {
        Ok(kiln_autograd::no_grad(|| g.contiguous())?)
    }
}

/// `t`'s elements typed as `T`, or an error (the dtype was checked before, so this is a bug guard).
pub(crate) fn typed<'a, T: OptFloat>(st: &'a kiln_device::Storage, t: &Tensor) -> Result<&'a [T]> {
    T::slice(st, t).ok_or_else(|| mismatch::<T>(t))
}

/// `t`'s elements typed as `T`, writable.
pub(crate) fn typed_mut<'a, T: OptFloat>(
    st: &'a mut kiln_device::Storage,
    t: &Tensor,
) -> Result<&'a mut [T]> {
    T::slice_mut(st, t).ok_or_else(|| mismatch::<T>(t))
}

fn mismatch<T: OptFloat>(t: &Tensor) -> Error {
    Error::Unsupported {
        op: "step",
        msg: format!(
            "expected a {} host tensor, got {} on {}; keep state and parameters on one device and dtype",
            T::DTYPE,
            t.dtype(),
            t.device()
        ),
    }
}
