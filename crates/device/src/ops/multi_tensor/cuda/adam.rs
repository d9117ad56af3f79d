//! Launcher of `kiln_mt_adam_f32`: one Adam/AdamW step over every f32 parameter of a list in
//! one launch, over a table of buffer addresses and per-parameter step scalars chunked like the
//! clip kernels.
//!
//! Invariants: the table entries match `struct KilnMtAdamTensor` (asserted below and in the
//! `.cu`); the kernel rounds every multiply and add in f32 as the CPU pass does; an empty list
//! launches nothing.

use cudarc::driver::{CudaStream, DeviceRepr, PushKernelArg};
use std::sync::Arc;

use super::{chunk_launch_config, chunk_table, MULTI_TENSOR_KERNELS};
use crate::cuda::driver_error;
use crate::cuda::kernels::load_function;
use crate::error::Result;

const _: () = assert!(std::mem::size_of::<AdamEntry>() == 56);
const _: () = assert!(std::mem::offset_of!(AdamEntry, step_size) == 48);

/// One f32 parameter of a fused Adam/AdamW step on the device (addresses of its buffers, its
/// length, and the step's per-parameter scalars).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamTensor {
    /// Parameter address.
    pub param: u64,
    /// Gradient address.
    pub grad: u64,
    /// First-moment address.
    pub exp_avg: u64,
    /// Second-moment address.
    pub exp_avg_sq: u64,
    /// Running-maximum address (amsgrad), 0 otherwise.
    pub max_exp_avg_sq: u64,
    /// Number of elements.
    pub len: u64,
    /// `lr / (1 - beta1^t)` for this parameter's step count `t`.
    pub step_size: f32,
    /// `sqrt(1 - beta2^t)`.
    pub bias_correction2_sqrt: f32,
}

// SAFETY: `#[repr(C)]`-compatible plain data laid out like `struct KilnMtAdamTensor`.
unsafe impl DeviceRepr for AdamEntry {}

/// Matches `struct KilnMtAdamTensor` in multi_tensor.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct AdamEntry {
    param: u64,
    grad: u64,
    exp_avg: u64,
    exp_avg_sq: u64,
    max_exp_avg_sq: u64,
    len: u64,
    step_size: f32,
    bias_correction2_sqrt: f32,
}

/// The step's constants, shared by every parameter of the group.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamConstants {
    /// `1 - beta1`.
    pub beta1_weight: f32,
    /// `beta2`.
    pub beta2: f32,
    /// `1 - beta2`.
    pub beta2_weight: f32,
    /// `eps`.
    pub eps: f32,
    /// Weight decay (used when `l2`).
    pub weight_decay: f32,
    /// `1 - lr * weight_decay` (used when `decoupled`).
    pub decay: f32,
    /// Gradient multiplier (`-scale` for maximize).
    pub grad_scale: f32,
    /// Adam's L2 penalty added to the gradient.
    pub l2: bool,
    /// AdamW's decoupled decay of the parameter.
    pub decoupled: bool,
}

/// Enqueues one fused Adam/AdamW step over every parameter in `list` (one launch). `clip`, when
/// given, is the device address of a `[total_norm, clip_coef]` pair (a [`super::DeviceNorm`])
/// whose coefficient scales every gradient as it is read.
pub fn adam_step_f32(
    stream: &Arc<CudaStream>,
    list: &[AdamTensor],
    k: &AdamConstants,
    clip: Option<u64>,
) -> Result<()> {
    let lens: Vec<usize> = list.iter().map(|t| t.len as usize).collect();
    let (chunk_entries, num_chunks) = chunk_table(&lens)?;
    if chunk_entries.is_empty() {
        return Ok(());
    }
    let entries: Vec<AdamEntry> = list
        .iter()
        .map(|t| AdamEntry {
            param: t.param,
            grad: t.grad,
            exp_avg: t.exp_avg,
            exp_avg_sq: t.exp_avg_sq,
            max_exp_avg_sq: t.max_exp_avg_sq,
            len: t.len,
            step_size: t.step_size,
            bias_correction2_sqrt: t.bias_correction2_sqrt,
        })
        .collect();
    let upload = |e| driver_error("cuMemcpyHtoD", e);
    let tensors = stream.clone_htod(&entries).map_err(upload)?;
    let chunks = stream.clone_htod(&chunk_entries).map_err(upload)?;
    let function = load_function(stream.context(), &MULTI_TENSOR_KERNELS, "kiln_mt_adam_f32")?;
    let (l2, decoupled) = (i32::from(k.l2), i32::from(k.decoupled));
    let clip = clip.unwrap_or(0);
    let mut launch = stream.launch_builder(&function);
    launch
        .arg(&tensors)
        .arg(&chunks)
        .arg(&num_chunks)
        .arg(&k.beta1_weight)
        .arg(&k.beta2)
        .arg(&k.beta2_weight)
        .arg(&k.eps)
        .arg(&k.weight_decay)
        .arg(&k.decay)
        .arg(&k.grad_scale)
        .arg(&l2)
        .arg(&decoupled);
    launch.arg(&clip);
    // SAFETY: the argument list matches kiln_mt_adam_f32; every address in the table is a live
    // f32 buffer of at least `len` elements (the caller's contract), written only within it.
    unsafe { launch.launch(chunk_launch_config(num_chunks)) }
        .map_err(|e| driver_error("cuLaunchKernel", e))?;
    Ok(())
}
