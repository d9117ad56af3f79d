//! SGD steps of CUDA parameters: every f32 parameter of a group in one launch of
//! `kiln-device`'s `kiln_mt_sgd_f32` (a table of parameter, gradient and momentum-buffer
//! addresses, chunked like the clip kernels). The kernel's update is the CPU pass's, rounding
//! for rounding. Without the `cuda` feature, CUDA parameters are refused earlier by
//! `checked_cuda_grad` with a message naming the feature.

use crate::sgd::{SgdOptions, SgdWork};
use crate::{Error, Result};

fn unsupported(msg: String) -> Error {
    Error::Unsupported { op: "step", msg }
}

/// One fused launch over `work` (all on one CUDA device).
#[cfg(feature = "cuda")]
pub(crate) fn sgd_step_cuda(o: &SgdOptions, work: &[SgdWork], scale: f64) -> Result<()> {
    use kiln_autograd::{Device, Tensor};
    use kiln_device::ops::multi_tensor::cuda::{sgd_step_f32, SgdConstants, SgdTensor};
    use kiln_device::Storage;
    let Some(first) = work.first() else {
        return Ok(());
    };
    let Device::Cuda(ordinal) = first.0.device() else {
        return Err(unsupported("expected CUDA parameters".into()));
    };
    if work.iter().any(|w| w.0.device() != first.0.device()) {
        return Err(unsupported(
            "the CUDA parameters of one group are on different devices; put each device's \
             parameters in their own group"
                .into(),
        ));
    }
    let addr = |st: &Storage, t: &Tensor| match st {
        Storage::Cuda(c) => Ok(c.device_address(t.layout().offset())),
        _ => Err(unsupported(
            "a CUDA parameter's momentum buffer is not in CUDA memory; keep the optimizer \
             state on the parameter's device"
                .into(),
        )),
    };
    let mut list = Vec::with_capacity(work.len());
    let mut guards = Vec::with_capacity(work.len());
    for (p, g, buf, first_step) in work {
        let pw = p.storage_write()?;
        let gr = g.storage_read();
        let bw = buf.as_ref().map(|b| b.storage_write()).transpose()?;
        list.push(SgdTensor {
            param: addr(&pw, p)?,
            grad: addr(&gr, g)?,
            momentum_buffer: match (&bw, buf) {
                (Some(b), Some(t)) => addr(b, t)?,
                _ => 0,
            },
            len: p.numel() as u64,
            first: *first_step,
        });
        guards.push((pw, gr, bw));
    }
    let k = SgdConstants {
        neg_lr: (-o.lr) as f32,
        weight_decay: o.weight_decay as f32,
        momentum: o.momentum as f32,
        dampening_weight: (1.0 - o.dampening) as f32,
        grad_scale: (if o.maximize { -scale } else { scale }) as f32,
        scaled: scale != 1.0 || o.maximize,
        has_wd: o.weight_decay != 0.0,
        nesterov: o.nesterov,
    };
    let stream = kiln_device::cuda_stream(ordinal)?;
    sgd_step_f32(&stream, &list, &k, None)?;
    drop(guards);
    Ok(())
}

/// Without the `cuda` feature no CUDA parameter gets this far (`checked_cuda_grad` refuses it).
#[cfg(not(feature = "cuda"))]
pub(crate) fn sgd_step_cuda(_: &SgdOptions, work: &[SgdWork], _: f64) -> Result<()> {
    if work.is_empty() {
        Ok(())
    } else {
        Err(unsupported(
            "CUDA parameters need kiln-optim's `cuda` feature".into(),
        ))
    }
}
