//! `clip_grad_norm_` for gradients on a CUDA device: the two launches of `kiln-device`'s
//! multi-tensor kernels (norm with last-block reduction, then scale reading the coefficient on
//! the device) over a table of `(pointer, length, dtype)` that is cached while the gradient set
//! is unchanged. `clip_grad_norm_` synchronises once, to read the total norm back (it returns an
//! `f64`); `clip_grad_norm_on_device` instead queues a 4-byte device copy of the total into a
//! new 0-d f32 tensor and returns without waiting. Both wait once more after the norm kernel
//! when `error_if_nonfinite` is set (the check needs the value on the host).

use crate::{Error, Result};
use kiln_autograd::{DType, Device, Tensor};
use kiln_device::ops::multi_tensor::cuda::{with_clip_plan, ClipPlan, DeviceTensor};
use kiln_device::Storage;
use std::collections::HashSet;

fn unsupported(msg: String) -> Error {
    Error::Unsupported {
        op: "clip_grad_norm_",
        msg,
    }
}

/// Clips `grads` (all on one CUDA device) in place; returns the total norm (one wait).
pub(crate) fn clip_grad_norm_cuda(
    names: &[String],
    grads: &[Tensor],
    max_norm: f64,
    norm_type: f64,
    error_if_nonfinite: bool,
) -> Result<f64> {
    clip_cuda(names, grads, max_norm, norm_type, error_if_nonfinite, None).map(f64::from)
}

/// Clips `grads` (all on one CUDA device) in place; returns the total norm as a 0-d f32 tensor
/// on their device, without waiting for the device (unless `error_if_nonfinite`).
pub(crate) fn clip_grad_norm_cuda_on_device(
    names: &[String],
    grads: &[Tensor],
    max_norm: f64,
    norm_type: f64,
    error_if_nonfinite: bool,
) -> Result<Tensor> {
    let out = Tensor::zeros(&[], DType::F32, grads[0].device())?;
    clip_cuda(
        names,
        grads,
        max_norm,
        norm_type,
        error_if_nonfinite,
        Some(&out),
    )?;
    Ok(out)
}

/// The two launches; with `out` (a 0-d f32 CUDA tensor) the total is copied into it on the
/// device and the returned value is NaN (not read back), else the total is read back.
fn clip_cuda(
    names: &[String],
    grads: &[Tensor],
    max_norm: f64,
    norm_type: f64,
    error_if_nonfinite: bool,
    out: Option<&Tensor>,
) -> Result<f32> {
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
        let out_guard = out.map(|t| t.storage_write()).transpose()?;
        let out_address = match out_guard.as_deref() {
            None => None,
            Some(Storage::Cuda(c)) => Some(c.device_address(0)),
            Some(_) => {
                return Err(unsupported(
                    "the output of the total norm is not in the gradients' CUDA memory".into(),
                ))
            }
        };
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
            if let Some(dst) = out_address {
                copy_total(plan, dst)?;
                return Ok((f32::NAN, false));
            }
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
    Ok(total)
}

/// Queues a copy of the plan's total norm (`result[0]`, 4 bytes) to device address `dst`, on
/// the plan's stream, so it is ordered after the norm kernel and before any later use of `dst`.
fn copy_total(plan: &ClipPlan, dst: u64) -> kiln_device::Result<()> {
    use kiln_device::cuda::cudarc::driver::{result::memcpy_dtod_async, DevicePtr};
    let stream = plan.result().stream().clone();
    let (src, _sync) = plan.result().device_ptr(&stream);
    // SAFETY: `src` is the plan's live two-float result buffer and `dst` a live 0-d f32 buffer
    // held under a write guard by the caller; the copy is queued on the stream both belong to.
    unsafe { memcpy_dtod_async(dst, src, std::mem::size_of::<f32>(), stream.cu_stream()) }.map_err(
        |e| kiln_device::Error::Cuda {
            op: "clip_grad_norm_on_device",
            msg: e.to_string(),
        },
    )
}
