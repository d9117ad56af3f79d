//! Adam/AdamW steps of CUDA parameters: every f32 parameter of a group in one launch of
//! `kiln-device`'s `kiln_mt_adam_f32` (a table of buffer addresses and per-parameter step
//! scalars, chunked like the clip kernels). Without the `cuda` feature, CUDA parameters are
//! refused with a message naming the feature.

use crate::adam::{AdamOptions, Work};
use crate::optimizer::StepItem;
use crate::{Error, Result};
use kiln_autograd::{DType, Tensor};

fn unsupported(msg: String) -> Error {
    Error::Unsupported { op: "step", msg }
}

/// The gradient of a CUDA parameter, checked: f32, contiguous, on the parameter's device.
pub(crate) fn checked_cuda_grad<S>(op: &'static str, item: &StepItem<'_, S>) -> Result<Tensor> {
    let (p, g) = (item.param, &item.grad);
    if !cfg!(feature = "cuda") {
        return Err(unsupported(format!(
            "{op}: parameter `{}` is on {}, but kiln-optim was built without its `cuda` feature; \
             enable it (the `kiln` crate's default `cuda` feature does)",
            item.name,
            p.device()
        )));
    }
    if p.dtype() != DType::F32 || g.dtype() != DType::F32 {
        return Err(unsupported(format!(
            "{op}: CUDA parameter `{}` and its gradient must be f32 (got {} and {}); keep master \
             weights in f32",
            item.name,
            p.dtype(),
            g.dtype()
        )));
    }
    if g.device() != p.device() || !p.is_contiguous() || !g.is_contiguous() {
        return Err(unsupported(format!(
            "{op}: CUDA parameter `{}` and its gradient must be contiguous and on the same device",
            item.name
        )));
    }
    Ok(g.clone())
}

/// One fused launch over `work` (all on one CUDA device).
#[cfg(feature = "cuda")]
pub(crate) fn adam_step_cuda(
    o: &AdamOptions,
    decoupled: bool,
    work: &[Work],
    scale: f64,
) -> Result<()> {
    use kiln_autograd::Device;
    use kiln_device::ops::multi_tensor::cuda::{adam_step_f32, AdamConstants, AdamTensor};
    use kiln_device::Storage;
    let Some(first) = work.first() else {
        return Ok(());
    };
    let Device::Cuda(ordinal) = first.p.device() else {
        return Err(unsupported("expected CUDA parameters".into()));
    };
    if work.iter().any(|w| w.p.device() != first.p.device()) {
        return Err(unsupported(
            "the CUDA parameters of one group are on different devices; put each device's \
             parameters in their own group"
                .into(),
        ));
    }
    let addr = |st: &Storage, t: &Tensor| match st {
        Storage::Cuda(c) => Ok(c.device_address(t.layout().offset())),
        _ => Err(unsupported(
            "a CUDA parameter's state is not in CUDA memory".into(),
        )),
    };
    let mut list = Vec::with_capacity(work.len());
    let mut guards = Vec::with_capacity(work.len() * 4);
    for w in work {
        let pw = w.p.storage_write()?;
        let gr = w.g.storage_read();
        let mw = w.m.storage_write()?;
        let vw = w.v.storage_write()?;
        let xw = w.vmax.as_ref().map(|x| x.storage_write()).transpose()?;
        list.push(AdamTensor {
            param: addr(&pw, &w.p)?,
            grad: addr(&gr, &w.g)?,
            exp_avg: addr(&mw, &w.m)?,
            exp_avg_sq: addr(&vw, &w.v)?,
            max_exp_avg_sq: match (&xw, &w.vmax) {
                (Some(x), Some(t)) => addr(x, t)?,
                _ => 0,
            },
            len: w.p.numel() as u64,
            step_size: w.k.step_size as f32,
            bias_correction2_sqrt: w.k.bc2_sqrt as f32,
        });
        guards.push((pw, gr, mw, vw, xw));
    }
    let has_wd = o.weight_decay != 0.0;
    let k = AdamConstants {
        beta1_weight: (1.0 - o.betas.0) as f32,
        beta2: o.betas.1 as f32,
        beta2_weight: (1.0 - o.betas.1) as f32,
        eps: o.eps as f32,
        weight_decay: o.weight_decay as f32,
        decay: (1.0 - o.lr * o.weight_decay) as f32,
        grad_scale: (if o.maximize { -scale } else { scale }) as f32,
        l2: has_wd && !decoupled,
        decoupled: has_wd && decoupled,
    };
    let stream = kiln_device::cuda_stream(ordinal)?;
    adam_step_f32(&stream, &list, &k, None)?;
    drop(guards);
    Ok(())
}

/// Without the `cuda` feature no CUDA parameter gets this far (`checked_cuda_grad` refuses it).
#[cfg(not(feature = "cuda"))]
pub(crate) fn adam_step_cuda(_: &AdamOptions, _: bool, work: &[Work], _: f64) -> Result<()> {
    if work.is_empty() {
        Ok(())
    } else {
        Err(unsupported(
            "CUDA parameters need kiln-optim's `cuda` feature".into(),
        ))
    }
}
