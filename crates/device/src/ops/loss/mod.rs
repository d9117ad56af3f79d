//! Fused softmax + cross-entropy: the loss of every position and its gradient in one kernel.
//!
//! The logits are viewed as `[N, C, D]`: `N` the batch, `C` the classes (PyTorch's dim 1) and
//! `D` the product of any trailing dims (`1` for plain `[N, C]` logits). Each position `(n, d)`
//! owns one row of `C` logits, read with stride `D`. The target distribution `q` of a row is
//! - for class-index targets `y`: `q = (1 - ε) · onehot(y) + ε / C` (ε = label smoothing);
//! - for class-probability targets `t` (same shape as the logits): `q = (1 - ε) · t + ε / C`,
//!
//! and with class weights `w` (all 1 when absent) the row's loss is
//! `Σ_c q_c w_c (lse - z_c)`, `lse = log Σ_c e^{z_c}`. That one formula is exactly PyTorch's
//! `cross_entropy` with `reduction='none'`: for index targets it expands to
//! `(1 - ε) w_y (lse - z_y) + ε / C · Σ_c w_c (lse - z_c)`, the NLL term plus the smoothing
//! term of `cross_entropy_loss_label_smoothing`. Its gradient is
//! `∂loss/∂z_j = softmax_j · S - q_j w_j` with `S = Σ_c q_c w_c`.
//!
//! A class with `q_c = 0` has coefficient `q_c w_c = 0` whatever its weight, so a NaN or infinite
//! weight of a class the target does not name never reaches the loss or the gradient (PyTorch
//! agrees); and a zero coefficient adds nothing even where `z_c = -inf` (a masked class), where
//! PyTorch's `0 · -inf` gives NaN.
//!
//! The statistics of a row are its maximum, the sum of `e^{z - max}`, `S = Σ q w` and the shifted
//! sum `Σ q w (z - max)`. The CUDA kernel and the CPU's class-major sweep gather them in one
//! streaming pass (a running maximum with the rescaled running sum, the "online softmax", the
//! shifted sum moved by `(old - new) · S` whenever the running maximum rises); the CPU's plain
//! `[N, C]` rows make a pass for the maximum and a vectorised one for the sum (`cpu_row.rs`),
//! the row staying in cache between them. Then one pass writes the gradient; nothing of size
//! `N·C` is stored but the gradient itself.
//! All row statistics accumulate in `f64`. The loss is `S · ln(sum) - Σ q w (z - max)`: with
//! non-negative targets and weights, two sums of like sign that overflow only where the loss
//! itself does (a `q w z` product would overflow beyond about 1e154). `ln(sum)` is never added
//! to the maximum: softmax is
//! `e^{(z - max) - ln(sum)}`, so logits of magnitude 1e4 (where `e^z` overflows even `f64`) or
//! 1e17 (where `max + ln(sum)` rounds back to `max`) give PyTorch's losses and gradients.
//!
//! The gradient is for unit upstream gradient per position (`reduction='none'`); autograd
//! multiplies it by the upstream gradient of each position in backward, so forward and
//! backward together read the logits once. Reductions are done by the caller from the
//! per-position losses and [`CrossEntropyOutput::total_weight`], the denominator of PyTorch's
//! `'mean'`: `Σ w_{y}` over positions whose target is not `ignore_index` for index targets
//! (the count of such positions without weights), and `N·D` for probability targets.
//!
//! Positions whose index target equals `ignore_index` get loss 0 and gradient 0. Every other
//! index must lie in `[0, C)`: targets are all checked before anything is written, and the first
//! bad one in row-major order comes back as [`KernelError::IndexOutOfRange`] with its value and
//! its position `[n, d]` (the CUDA kernel reports the same first position). On CUDA nothing
//! waits: the targets are checked on the device by a deferred check (`cuda/deferred/mod.rs`), and a
//! bad one is reported, with the same value and position, at the calling thread's next
//! synchronisation (or at the op under eager checks); the kernel gives its row a NaN loss and
//! gradient and reads nothing through it. The mean's denominator stays on the device too.

pub mod cpu;
mod cpu_row;
#[cfg(feature = "cuda")]
pub mod cuda;

use super::kernel_error::KernelError;
use crate::ops::buffer::BufferOps;
use crate::seam::{pass_through, seam_trait, Lift};
use crate::Layout;

pass_through!(ref CrossEntropySpec);

impl<A: Lift<B>, B> Lift<CrossEntropyOutput<B>> for CrossEntropyOutput<A> {
    fn lift(self) -> CrossEntropyOutput<B> {
        CrossEntropyOutput {
            losses: self.losses.lift(),
            grad: self.grad.lift(),
            total_weight: self.total_weight.lift(),
        }
    }
}

seam_trait! {
    /// Fused losses.
    pub trait LossOps: BufferOps {
        /// Fused softmax + cross-entropy over `[N, C, D]` logits (`layout`, contiguous or not):
        /// per-position losses, optionally their gradient, and the mean's denominator. `target`
        /// is `[N, D]` integers or `[N, C, D]` floats as `spec.target` says; `weight` is `[C]`.
        op("cross_entropy")
        fn softmax_cross_entropy(
            &self,
            layout: &Layout,
            target: &Self,
            target_layout: &Layout,
            weight: Option<(&Self, &Layout)>,
            spec: &CrossEntropySpec,
        ) -> crate::Result<CrossEntropyOutput<Self>>;
    }
}

/// Sizes of the `[N, C, D]` view of the logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrossEntropyShape {
    /// `N`: the batch size (dim 0 of the logits).
    pub batch: usize,
    /// `C`: the number of classes (dim 1 of the logits).
    pub classes: usize,
    /// `D`: the product of the dims after the class dim (1 when there are none).
    pub inner: usize,
}

impl CrossEntropyShape {
    /// Number of positions (`N·D`), the length of the per-position outputs.
    pub fn positions(&self) -> usize {
        self.batch * self.inner
    }

    /// Number of logits (`N·C·D`).
    pub fn logits(&self) -> usize {
        self.batch * self.classes * self.inner
    }
}

/// Which form the targets take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetKind {
    /// One class index per position (`[N, D]` integers).
    Indices,
    /// A class distribution per position (`[N, C, D]` floats, the logits' shape).
    Probabilities,
}

/// Everything but the buffers of a fused cross-entropy call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CrossEntropySpec {
    /// The `[N, C, D]` view of the logits.
    pub shape: CrossEntropyShape,
    /// Whether the targets are class indices or class probabilities.
    pub target: TargetKind,
    /// Index targets equal to this get loss 0 and no gradient (PyTorch's default is -100).
    pub ignore_index: i64,
    /// Label smoothing ε in `[0, 1]`.
    pub label_smoothing: f64,
    /// Whether to compute the gradient as well.
    pub with_grad: bool,
}

/// What the fused kernel returns, over any buffer type `S`.
#[derive(Debug, Clone)]
pub struct CrossEntropyOutput<S> {
    /// Per-position losses `[N, D]` (PyTorch's `reduction='none'`, weights applied).
    pub losses: S,
    /// `∂ loss[n, d] / ∂ logits[n, :, d]`, `[N, C, D]`, when asked for.
    pub grad: Option<S>,
    /// The denominator of `reduction='mean'` (see the module docs): one `F64` element on the
    /// op's device, so that dividing by it needs no wait for the device.
    pub total_weight: S,
}

/// Checks the index targets: the first (row-major) one that is neither `ignore_index` nor in
/// `[0, C)` is an error with its value and position `[n, d]`.
pub fn check_targets(spec: &CrossEntropySpec, targets: &[i64]) -> Result<(), KernelError> {
    let CrossEntropyShape { classes, inner, .. } = spec.shape;
    let bad = targets
        .iter()
        .position(|&t| t != spec.ignore_index && (t < 0 || t as u64 >= classes as u64));
    match bad {
        None => Ok(()),
        Some(flat) => Err(KernelError::IndexOutOfRange {
            op: "cross_entropy",
            index: targets[flat],
            position: vec![flat / inner.max(1), flat % inner.max(1)],
            dim: 1,
            size: classes,
        }),
    }
}

/// Checks the parameters of a call (class count, smoothing).
pub fn check_spec(spec: &CrossEntropySpec) -> Result<(), KernelError> {
    if spec.shape.classes == 0 {
        return Err(KernelError::ZeroParameter {
            op: "cross_entropy",
            param: "classes",
        });
    }
    if !(0.0..=1.0).contains(&spec.label_smoothing) {
        return Err(KernelError::InvalidShape {
            op: "cross_entropy",
            shape: vec![],
            rule: format!(
                "label_smoothing {} is outside [0, 1]; pass a value between 0.0 and 1.0",
                spec.label_smoothing
            ),
        });
    }
    Ok(())
}
