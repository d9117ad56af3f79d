//! [`GradScaler::unscale_`](crate::GradScaler::unscale_) for gradients on CUDA devices: one
//! launch per device of `kiln-device`'s `kiln_mt_unscale`, which multiplies every gradient by
//! `1 / scale` in place and sets a found-inf flag in device memory in the same pass. The flags
//! stay on the device until `GradScaler::step` (or `update`) needs the answer; reading them is
//! one 4-byte copy per device, as PyTorch's `found_inf.item()`.

use crate::{Error, Result};
use kiln_autograd::Tensor;

fn unsupported(msg: String) -> Error {
    Error::Unsupported {
        op: "unscale_",
        msg,
    }
}

/// The found-inf flags of one `unscale_`, one per CUDA device the gradients were on.
#[derive(Debug, Default)]
pub(crate) struct DeviceFoundInf {
    #[cfg(feature = "cuda")]
    flags: Vec<kiln_device::ops::multi_tensor::cuda::FoundInfFlag>,
}

impl DeviceFoundInf {
    /// True when any device saw a NaN or infinite gradient (reads each flag: a synchronisation).
    pub(crate) fn read(&self) -> Result<bool> {
        #[cfg(feature = "cuda")]
        for f in &self.flags {
            if f.read()? {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// Unscales `grads` (every one on a CUDA device) by `inv_scale`, one launch per device; the
/// found-inf answer stays on the devices.
#[cfg(feature = "cuda")]
pub(crate) fn unscale_cuda(grads: &[Tensor], inv_scale: f32) -> Result<DeviceFoundInf> {
    use kiln_autograd::{DType, Device};
    use kiln_device::ops::multi_tensor::cuda::{unscale_and_check, DeviceTensor, FoundInfFlag};
    use kiln_device::Storage;
    use std::collections::{BTreeMap, HashSet};
    let mut by_device: BTreeMap<usize, Vec<&Tensor>> = BTreeMap::new();
    let mut keys = HashSet::new();
    for g in grads {
        let Device::Cuda(ordinal) = g.device() else {
            return Err(unsupported("expected CUDA gradients".into()));
        };
        if !matches!(
            g.dtype(),
            DType::F32 | DType::F64 | DType::F16 | DType::BF16
        ) {
            return Err(unsupported(format!(
                "a gradient on {} is {}; gradients must be a float dtype (f32, f64, f16, bf16)",
                g.device(),
                g.dtype()
            )));
        }
        if !g.is_contiguous() || !keys.insert(g.storage_key()) {
            return Err(unsupported(format!(
                "a gradient on {} is a strided view or shares its buffer with another gradient; \
                 the CUDA path needs one dense buffer per gradient (use contiguous())",
                g.device()
            )));
        }
        by_device.entry(ordinal).or_default().push(g);
    }
    let mut out = DeviceFoundInf::default();
    for (ordinal, list) in by_device {
        let stream = kiln_device::cuda_stream(ordinal)?;
        let mut flag = FoundInfFlag::new(&stream)?;
        kiln_autograd::no_grad(|| -> Result<()> {
            let guards = list
                .iter()
                .map(|g| g.storage_write())
                .collect::<Result<Vec<_>, _>>()?;
            let table = guards
                .iter()
                .zip(&list)
                .map(|(st, g)| match &**st {
                    Storage::Cuda(c) => Ok(DeviceTensor {
                        ptr: c.device_address(g.layout().offset()),
                        len: g.numel() as u64,
                        dtype: g.dtype(),
                    }),
                    _ => Err(unsupported("a gradient is not in CUDA memory".into())),
                })
                .collect::<Result<Vec<_>>>()?;
            unscale_and_check(&stream, &table, inv_scale, &mut flag)?;
            Ok(())
        })?;
        out.flags.push(flag);
    }
    Ok(out)
}

/// Without the `cuda` feature CUDA gradients cannot be unscaled; the message names the feature.
#[cfg(not(feature = "cuda"))]
pub(crate) fn unscale_cuda(grads: &[Tensor], _: f32) -> Result<DeviceFoundInf> {
    match grads.first() {
        None => Ok(DeviceFoundInf::default()),
        Some(g) => Err(unsupported(format!(
            "a gradient is on {}, but kiln-optim was built without its `cuda` feature; enable \
             it (the `kiln` crate's default `cuda` feature does)",
            g.device()
        ))),
    }
}
