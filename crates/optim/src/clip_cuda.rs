//! `clip_grad_norm_` for gradients on a CUDA device: the two launches of `kiln-device`'s
//! multi-tensor kernels (norm with last-block reduction, then scale reading the coefficient on
//! the device) over a table of `(pointer, length, dtype)` that is cached while the gradient set
//! is unchanged. The only synchronisation is reading the total norm back at the end (this API
//! returns it as `f64`), plus one after the norm kernel when `error_if_nonfinite` is set.

use crate::{Error, Result};
use kiln_autograd::{Device, Tensor};
use kiln_device::ops::multi_tensor::cuda::{with_clip_plan, DeviceTensor};
use kiln_device::Storage;
use std::collections::HashSet;

fn unsupported(msg: String) -> Error {
    Error::Unsupported {
        op: "clip_grad_norm_",
        msg,
    }
}

/// Clips `grads` (all on one CUDA device) in place; returns the total norm.
pub(crate) fn clip_grad_norm_cuda(
    names: &[String],
    grads: &[Tensor],
    max_norm: f64,
    norm_type: f64,
    error_if_nonfinite: bool,
) -> Result<f64> {
    let device = grads[0].device();
    let Device::Cuda(ordinal) = device else {
        return Err(unsupported("expected CUDA gradients".into()));
    };
    let mut keys = HashSet::new();
    for (n, g) in names.iter().zip(grads) {
        if g.device() != device {
            return Err(unsupported(format!(
                "gradient of `{n}` is on {} but the first one is on {device}; keep all \
                 gradients on one device",
                g.device()
            )));
        }
        if !g.is_contiguous() || !keys.insert(g.storage_key()) {
            return Err(unsupported(format!(
                "gradient of `{n}` is a strided view or shares its buffer with another \
                 gradient; the CUDA path needs one dense buffer per gradient (use contiguous())"
            )));
        }
    }
    let (total, nonfinite) = kiln_autograd::no_grad(|| -> Result<(f32, bool)> {
        let guards = grads
            .iter()
            .map(|g| g.storage_write())
            .collect::<Result<Vec<_>, _>>()?;
        let list = guards
            .iter()
            .zip(grads)
            .map(|(st, g)| match &**st {
                Storage::Cuda(c) => Ok(DeviceTensor {
                    ptr: c.device_address(g.layout().offset()),
                    len: g.numel() as u64,
                    dtype: g.dtype(),
                }),
                _ => Err(unsupported("a gradient is not in CUDA memory".into())),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(with_clip_plan(ordinal, &list, |plan| {
            plan.norm(norm_type, max_norm)?;
            if error_if_nonfinite {
                let [total, _] = plan.read_result()?;
                if !total.is_finite() {
                    return Ok((total, true));
                }
            }
            plan.scale()?;
            let [total, _] = plan.read_result()?;
            Ok((total, false))
        })?)
    })?;
    if nonfinite {
        // Error path only: find the first non-finite gradient norm on the host.
        let host: Vec<Tensor> = grads
            .iter()
            .map(|g| g.to_device(Device::Cpu))
            .collect::<Result<_, _>>()?;
        let norms = crate::clip::per_tensor_norms(&host, norm_type)?;
        let first = norms.iter().position(|n| !n.is_finite());
        return Err(Error::NonFiniteNorm {
            norm_type,
            total: f64::from(total),
            name: first.map_or_else(
                || "(none: the total overflowed)".into(),
                |i| names[i].clone(),
            ),
        });
    }
    Ok(f64::from(total))
}
