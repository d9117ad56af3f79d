//! Multi-tensor ops: one launch (CUDA) or one parallel pass (CPU) over a whole *list* of
//! tensors, the way apex's `multi_tensor_apply` and PyTorch's `_foreach_*` ops work. Gradient
//! clipping by global norm, AMP's unscale-and-check and the optimizers' fused Adam/AdamW and SGD
//! steps are built on them.
//!
//! # The family
//!
//! [`MultiTensorOps`] is this family's trait: every op over lists of operands, implemented once
//! per device (`CpuStorage` in `cpu.rs` with its kernels in `cpu/`, `CudaStorage` in `cuda.rs`
//! launching `multi_tensor.cu`). Callers (kiln-optim) use the device-agnostic functions of
//! `dispatch/mod.rs` ([`global_norm`], [`scale_by_clip_coef_`], [`clip_by_global_norm_`],
//! [`scale_`], [`clamp_`], [`unscale_and_check_`], [`adam_step`], [`sgd_step`],
//! [`per_tensor_norms`]) over `(&Storage, &Layout)` operands; they never name a device. That
//! file is the family's only dispatch on `Storage` variants: it checks that every operand of a
//! list is on one device (a mixed list is [`Error::DeviceMismatch`](crate::Error::DeviceMismatch)
//! naming the op, never a panic) and hands the list to that device's implementation. Operands
//! must be contiguous views of their buffers (a strided view is a typed error); distinct `&mut`
//! operands are distinct buffers by construction.
//!
//! # Design
//!
//! A training step touches every gradient a few times: compute the global norm, maybe scale,
//! unscale for AMP, read again in the optimizer. With 100-2,000 tensors per model, a per-tensor
//! loop pays per-tensor dispatch (and on CUDA, a launch and often a host sync) for each one, and
//! small tensors never fill the machine. The multi-tensor design instead
//!
//! 1. **plans** fixed-size chunks over the list ([`plan_chunks`]): tensor `t` of `len` elements
//!    becomes `ceil(len / CHUNK_ELEMS)` chunks `(t, start, len)`, in list order. Indexes are
//!    `usize` (64-bit), so tensors past 2^31 elements need nothing special; empty tensors get no
//!    chunk at all; a ragged last chunk is just shorter.
//! 2. **runs** every chunk in parallel (rayon on the CPU; one CUDA block per chunk-slice on the
//!    GPU), each producing one partial result (a partial sum of `|x|^p`, a max, a found-inf flag);
//! 3. **combines** the partials of each tensor in plan order, on one thread. Because the chunk
//!    boundaries depend only on the tensor lengths and the combine order is fixed, the result is
//!    bitwise identical for every thread count (rayon only decides *who* computes a chunk).
//!
//! Gradient clipping is then two passes: the norm pass reads every gradient once, and the scale
//! pass runs **only when the clip coefficient is below 1** (multiplying by exactly 1 is an
//! identity, so skipping it changes no bit; a NaN coefficient still scales, as PyTorch does).
//! Half-precision inputs (`f16`, `bf16`) are widened as they are read and accumulated in `f64`
//! on the CPU (`f32` on CUDA), never in their own precision. `f32` inputs of the 1- and 2-norms
//! (the hot path) accumulate in 64 `f32` lanes over sub-blocks of 1,024 elements (16 terms per
//! lane) that are then added into an `f64` total, which keeps full SIMD width and `f32`
//! accuracy however long the tensor is. On CUDA the norm kernel reads a device-side table of
//! `(pointer, length, dtype)` and its last block to finish writes the total norm and the clip
//! coefficient to device memory ([`GlobalNorm`] keeps them there), so neither pass needs the
//! host.
//!
//! The optimizer steps are one pass over the chunks of every parameter of a list (zipped with
//! its gradient and state buffers), rounding every multiply and add in the parameter dtype the
//! same way on both devices (the CUDA SGD step is bitwise the CPU's for the same f32 inputs;
//! the CUDA Adam step is tested against the CPU's to 1e-6 relative).

mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
mod dispatch;
mod norm;

pub use dispatch::{
    adam_step, clamp_, clip_by_global_norm_, global_norm, per_tensor_norms, scale_,
    scale_by_clip_coef_, sgd_step, unscale_and_check_, FoundInf, GlobalNorm,
};
pub use norm::{clip_coef, nan_max, nan_min, NormKind};

use crate::{Layout, Result};

/// A tensor read by a multi-tensor op: its buffer and its (contiguous) layout in it.
pub type Operand<'a, S = crate::Storage> = (&'a S, &'a Layout);

/// A tensor written in place by a multi-tensor op: its buffer and its (contiguous) layout.
pub type OperandMut<'a, S = crate::Storage> = (&'a mut S, &'a Layout);

/// A global norm computed on the host: every tensor's norm, their total and the clip
/// coefficient.
#[derive(Debug, Clone, PartialEq)]
pub struct HostNorm {
    /// The norm of each tensor, in list order.
    pub per_tensor: Vec<f64>,
    /// The norm of the per-tensor norms.
    pub total: f64,
    /// `clip_coef(max_norm, total)`.
    pub coef: f64,
}

/// Hyper-parameters of one Adam/AdamW step, shared by every parameter of the list.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamHyper {
    /// Learning rate.
    pub lr: f64,
    /// Decay rate of the first moment.
    pub beta1: f64,
    /// Decay rate of the second moment.
    pub beta2: f64,
    /// Added to the denominator.
    pub eps: f64,
    /// Weight decay: an L2 penalty added to the gradient (Adam) or a decoupled decay of the
    /// parameter (AdamW, `decoupled`).
    pub weight_decay: f64,
    /// AdamW's decoupled weight decay instead of Adam's L2 penalty.
    pub decoupled: bool,
    /// Maximize the objective (the gradient is negated).
    pub maximize: bool,
    /// Every gradient is read multiplied by this (a clip or unscale coefficient; 1 for none).
    pub grad_scale: f64,
}

/// The per-parameter scalars of one Adam step (bias corrections of its own step count).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamStepScalars {
    /// `lr / (1 - beta1^t)`.
    pub step_size: f64,
    /// `sqrt(1 - beta2^t)`.
    pub bias_correction2_sqrt: f64,
}

/// One parameter of an Adam/AdamW step: the buffers it reads and updates.
#[derive(Debug)]
pub struct AdamOperands<'a, S = crate::Storage> {
    /// The parameter, updated in place.
    pub param: OperandMut<'a, S>,
    /// Its gradient (same dtype and length).
    pub grad: Operand<'a, S>,
    /// First moment, updated in place.
    pub exp_avg: OperandMut<'a, S>,
    /// Second moment, updated in place.
    pub exp_avg_sq: OperandMut<'a, S>,
    /// Running maximum of the second moment (amsgrad), updated in place.
    pub max_exp_avg_sq: Option<OperandMut<'a, S>>,
    /// This parameter's bias corrections.
    pub scalars: AdamStepScalars,
}

/// Hyper-parameters of one SGD step, shared by every parameter of the list.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdHyper {
    /// Learning rate.
    pub lr: f64,
    /// Momentum factor (0 for none).
    pub momentum: f64,
    /// Dampening of the momentum.
    pub dampening: f64,
    /// L2 penalty added to the gradient.
    pub weight_decay: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// Maximize the objective (the gradient is negated).
    pub maximize: bool,
    /// Every gradient is read multiplied by this (1 for none).
    pub grad_scale: f64,
}

/// One parameter of an SGD step.
#[derive(Debug)]
pub struct SgdOperands<'a, S = crate::Storage> {
    /// The parameter, updated in place.
    pub param: OperandMut<'a, S>,
    /// Its gradient (same dtype and length).
    pub grad: Operand<'a, S>,
    /// The momentum buffer (when momentum is nonzero), updated in place.
    pub momentum_buffer: Option<OperandMut<'a, S>>,
    /// True on the buffer's first step: it then takes the gradient as it is.
    pub first_momentum_step: bool,
}

/// The multi-tensor op family, implemented once per device storage. Every list holds operands
/// of that one device; `op` names the public operation for error messages.
pub trait MultiTensorOps: Sized {
    /// The total norm and clip coefficient where this device keeps them.
    type Norm;
    /// A found-inf answer where this device keeps it.
    type FoundInf;

    /// The norm of each tensor, on the host.
    fn per_tensor_norms(
        op: &'static str,
        tensors: &[Operand<'_, Self>],
        kind: NormKind,
    ) -> Result<Vec<f64>>;
    /// The norm of the per-tensor norms and `clip_coef(max_norm, total)`, in one read pass.
    fn global_norm(
        op: &'static str,
        tensors: &[Operand<'_, Self>],
        kind: NormKind,
        max_norm: f64,
    ) -> Result<Self::Norm>;
    /// The total of a norm, on the host (waits for the device).
    fn norm_total(norm: &Self::Norm) -> Result<f64>;
    /// Copies the total of a norm into a 0-d f32 tensor of this device, without waiting.
    fn copy_norm_total(
        op: &'static str,
        norm: &Self::Norm,
        out: OperandMut<'_, Self>,
    ) -> Result<()>;
    /// Multiplies every element by the norm's clip coefficient when it is below 1 (or NaN).
    fn scale_by_clip_coef_(
        op: &'static str,
        tensors: &mut [OperandMut<'_, Self>],
        norm: &Self::Norm,
    ) -> Result<()>;
    /// `clip_grad_norm_`'s two passes over one list: its global norm, then the scale by the
    /// clip coefficient (skipped as by [`scale_by_clip_coef_`](Self::scale_by_clip_coef_), and
    /// also when `refuse_nonfinite` and the total is NaN or infinite, which the returned flag
    /// says). The default runs the two ops; a device may prepare the list once for both.
    fn clip_by_global_norm_(
        op: &'static str,
        tensors: &mut [OperandMut<'_, Self>],
        kind: NormKind,
        max_norm: f64,
        refuse_nonfinite: bool,
    ) -> Result<(Self::Norm, bool)> {
        let read: Vec<Operand<'_, Self>> = tensors.iter().map(|(s, l)| (&**s, *l)).collect();
        let norm = Self::global_norm(op, &read, kind, max_norm)?;
        drop(read);
        if refuse_nonfinite && !Self::norm_total(&norm)?.is_finite() {
            return Ok((norm, true));
        }
        Self::scale_by_clip_coef_(op, tensors, &norm)?;
        Ok((norm, false))
    }
    /// Multiplies every element by `coef`.
    fn scale_(op: &'static str, tensors: &mut [OperandMut<'_, Self>], coef: f64) -> Result<()>;
    /// Clamps every element to `[-limit, limit]` (NaN stays NaN).
    fn clamp_(op: &'static str, tensors: &mut [OperandMut<'_, Self>], limit: f64) -> Result<()>;
    /// Multiplies every element by `inv_scale` and records whether any was NaN or infinite.
    fn unscale_and_check_(
        op: &'static str,
        tensors: &mut [OperandMut<'_, Self>],
        inv_scale: f32,
    ) -> Result<Self::FoundInf>;
    /// Reads a found-inf answer on the host (waits for the device).
    fn read_found_inf(found: &Self::FoundInf) -> Result<bool>;
    /// One fused Adam/AdamW step over every parameter of `list`.
    fn adam_step(
        op: &'static str,
        list: &mut [AdamOperands<'_, Self>],
        hyper: &AdamHyper,
    ) -> Result<()>;
    /// One fused SGD step over every parameter of `list`.
    fn sgd_step(
        op: &'static str,
        list: &mut [SgdOperands<'_, Self>],
        hyper: &SgdHyper,
    ) -> Result<()>;
}

/// Elements per chunk: 64 Ki elements (256 KiB of `f32`) is large enough to amortise scheduling
/// and small enough to balance 2,000 small tensors across threads.
pub const CHUNK_ELEMS: usize = 1 << 16;

/// One unit of parallel work: `len` elements of tensor `tensor` starting at element `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Index of the tensor in the list.
    pub tensor: usize,
    /// First element of the chunk within the tensor.
    pub start: usize,
    /// Number of elements (`chunk_elems`, or fewer for a tensor's last chunk).
    pub len: usize,
}

/// Splits tensors of the given lengths into chunks of `chunk_elems` (the last chunk of each
/// tensor may be shorter; empty tensors get none), in list order. `chunk_elems` of 0 is treated
/// as 1.
pub fn plan_chunks(lens: &[usize], chunk_elems: usize) -> Vec<Chunk> {
    let step = chunk_elems.max(1);
    let total: usize = lens.iter().map(|&n| n.div_ceil(step)).sum();
    let mut out = Vec::with_capacity(total);
    for (tensor, &len) in lens.iter().enumerate() {
        let mut start = 0usize;
        while start < len {
            let n = step.min(len - start);
            out.push(Chunk {
                tensor,
                start,
                len: n,
            });
            start += n;
        }
    }
    out
}

/// Consecutive index ranges over items of the given lengths, each (but the last) holding at
/// least `target` elements.
pub fn batch_ranges(
    lens: impl Iterator<Item = usize>,
    target: usize,
) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut acc, mut n) = (0, 0usize, 0);
    for len in lens {
        n += 1;
        acc += len;
        if acc >= target {
            out.push(start..n);
            start = n;
            acc = 0;
        }
    }
    if start < n {
        out.push(start..n);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_each_tensor_in_order_and_skip_empty_ones() {
        let plan = plan_chunks(&[5, 0, 8, 1], 4);
        let want = [(0, 0, 4), (0, 4, 1), (2, 0, 4), (2, 4, 4), (3, 0, 1)];
        let got: Vec<_> = plan.iter().map(|c| (c.tensor, c.start, c.len)).collect();
        assert_eq!(got, want);
        assert!(plan_chunks(&[0, 0], 4).is_empty());
        assert_eq!(plan_chunks(&[3], 0).len(), 3);
    }

    #[test]
    fn chunk_indexes_past_2_pow_31_and_32_are_exact() {
        // A 2^33 + 3 element tensor (32 GiB of f32 if it existed): the planner only does index
        // arithmetic, so this checks offsets past u32 without allocating it.
        let len = (1usize << 33) + 3;
        let plan = plan_chunks(&[7, len], CHUNK_ELEMS);
        assert_eq!(plan.len(), 1 + (1 << 33) / CHUNK_ELEMS + 1);
        let last = plan.last().unwrap();
        assert_eq!(last.tensor, 1);
        assert_eq!(last.start, 1usize << 33);
        assert_eq!(last.len, 3);
        let past_2_31 = plan.iter().find(|c| c.start > (1 << 31)).unwrap();
        assert_eq!(past_2_31.start, (1 << 31) + CHUNK_ELEMS);
        let covered: usize = plan.iter().filter(|c| c.tensor == 1).map(|c| c.len).sum();
        assert_eq!(covered, len);
    }
}
