//! Launcher of `kiln_mt_sgd_f32`: one SGD step (momentum, dampening, Nesterov, weight decay,
//! maximize) over every f32 parameter of a group in one launch, with the same chunk table as
//! the clip and Adam kernels. The kernel rounds every multiply and add separately, so a step
//! is bitwise the CPU pass's for the same inputs.

use cudarc::driver::{CudaStream, DeviceRepr, PushKernelArg};
use std::sync::Arc;

use super::{chunk_launch_config, chunk_table, MULTI_TENSOR_KERNELS};
use crate::cuda::driver_error;
use crate::cuda::kernels::load_function;
use crate::error::Result;

/// One f32 parameter of a fused SGD step on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SgdTensor {
    /// Parameter address.
    pub param: u64,
    /// Gradient address.
    pub grad: u64,
    /// Momentum-buffer address, 0 when momentum is 0.
    pub momentum_buffer: u64,
    /// Number of elements.
    pub len: u64,
    /// True on the momentum buffer's first step (it then takes the gradient as it is).
    pub first: bool,
}

/// Matches `struct KilnMtSgdTensor` in multi_tensor.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct SgdEntry {
    param: u64,
    grad: u64,
    momentum_buffer: u64,
    len: u64,
    first: u32,
    pad: u32,
}

// SAFETY: plain `#[repr(C)]` data laid out like `struct KilnMtSgdTensor`.
unsafe impl DeviceRepr for SgdEntry {}

// multi_tensor.cu `static_assert`s the same numbers.
const _: () = assert!(std::mem::size_of::<SgdEntry>() == 40);
const _: () = assert!(std::mem::offset_of!(SgdEntry, first) == 32);

/// The step's constants, shared by every parameter of the group (each already rounded to f32
/// the way the CPU pass rounds it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdConstants {
    /// `-lr`.
    pub neg_lr: f32,
    /// Weight decay (used when `has_wd`).
    pub weight_decay: f32,
    /// Momentum factor.
    pub momentum: f32,
    /// `1 - dampening`.
    pub dampening_weight: f32,
    /// Gradient multiplier, negated for maximize.
    pub grad_scale: f32,
    /// Multiply the gradient by `grad_scale` (false when it is exactly 1).
    pub scaled: bool,
    /// Add `weight_decay * p` to the gradient.
    pub has_wd: bool,
    /// Nesterov momentum.
    pub nesterov: bool,
}

/// Enqueues one fused SGD step over every parameter in `list` (one launch). `clip`, when given,
/// is the device address of a `[total_norm, clip_coef]` pair (a [`super::DeviceNorm`]) whose
/// coefficient scales every gradient as it is read.
pub fn sgd_step_f32(
    stream: &Arc<CudaStream>,
    list: &[SgdTensor],
    k: &SgdConstants,
    clip: Option<u64>,
) -> Result<()> {
    let lens: Vec<usize> = list.iter().map(|t| t.len as usize).collect();
    let (chunk_entries, num_chunks) = chunk_table(&lens)?;
    if chunk_entries.is_empty() {
        return Ok(());
    }
    let entries: Vec<SgdEntry> = list
        .iter()
        .map(|t| SgdEntry {
            param: t.param,
            grad: t.grad,
            momentum_buffer: t.momentum_buffer,
            len: t.len,
            first: u32::from(t.first),
            pad: 0,
        })
        .collect();
    let upload = |e| driver_error("cuMemcpyHtoD", e);
    let tensors = stream.clone_htod(&entries).map_err(upload)?;
    let chunks = stream.clone_htod(&chunk_entries).map_err(upload)?;
    let function = load_function(stream.context(), &MULTI_TENSOR_KERNELS, "kiln_mt_sgd_f32")?;
    let (scaled, has_wd, nesterov) = (
        i32::from(k.scaled),
        i32::from(k.has_wd),
        i32::from(k.nesterov),
    );
    let clip = clip.unwrap_or(0);
    let mut launch = stream.launch_builder(&function);
    launch
        .arg(&tensors)
        .arg(&chunks)
        .arg(&num_chunks)
        .arg(&k.neg_lr)
        .arg(&k.weight_decay)
        .arg(&k.momentum)
        .arg(&k.dampening_weight)
        .arg(&k.grad_scale)
        .arg(&scaled)
        .arg(&has_wd)
        .arg(&nesterov);
    launch.arg(&clip);
    // SAFETY: the argument list matches kiln_mt_sgd_f32; every address in the table is a live
    // f32 buffer of at least `len` elements (the caller's contract), written only within it.
    unsafe { launch.launch(chunk_launch_config(num_chunks)) }
        .map_err(|e| driver_error("cuLaunchKernel", e))?;
    Ok(())
}
