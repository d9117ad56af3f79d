//! Multi-tensor kernels: one launch (CUDA) or one parallel pass (CPU) over a whole *list* of
//! tensors, the way apex's `multi_tensor_apply` and PyTorch's `_foreach_*` ops work. Gradient
//! clipping by global norm, AMP's unscale-and-check and the optimizers' fused steps are built on
//! them.
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
//! (the hot path) accumulate in 16 `f32` lanes over sub-blocks of 256 elements (16 terms per
//! lane) that are then added into an `f64` total, which keeps full SIMD width and `f32`
//! accuracy however long the tensor is.
//!
//! [`cpu`] holds the CPU kernels over typed slices; `cuda` (behind the `cuda` feature) launches
//! `multi_tensor.cu`, whose norm kernel reads a device-side table of `(pointer, length, dtype)`
//! and whose last block to finish writes the total norm and the clip coefficient to device
//! memory, so neither pass needs the host.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

use crate::DType;
use half::{bf16, f16};

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

/// Which vector norm to compute, decoded from PyTorch's `norm_type` float.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NormKind {
    /// `p = 0`: the number of nonzero elements.
    Zero,
    /// `p = 1`: the sum of absolute values.
    One,
    /// `p = 2`: the Euclidean norm.
    Two,
    /// `p = inf`: the largest absolute value (NaN-propagating).
    Inf,
    /// `p = -inf`: the smallest absolute value (NaN-propagating).
    NegInf,
    /// Any other `p`: `(sum |x|^p)^(1/p)`.
    P(f64),
}

impl NormKind {
    /// Decodes `norm_type`; `None` for NaN, which names no norm.
    pub fn from_norm_type(norm_type: f64) -> Option<NormKind> {
        Some(if norm_type.is_nan() {
            return None;
        } else if norm_type == 0.0 {
            NormKind::Zero
        } else if norm_type == 1.0 {
            NormKind::One
        } else if norm_type == 2.0 {
            NormKind::Two
        } else if norm_type == f64::INFINITY {
            NormKind::Inf
        } else if norm_type == f64::NEG_INFINITY {
            NormKind::NegInf
        } else {
            NormKind::P(norm_type)
        })
    }

    /// The reduction's value over no elements.
    pub fn identity(self) -> f64 {
        match self {
            NormKind::NegInf => f64::INFINITY,
            _ => 0.0,
        }
    }

    /// Combines two partial reductions (sum, or NaN-propagating max/min).
    pub fn combine(self, a: f64, b: f64) -> f64 {
        match self {
            NormKind::Inf => nan_max(a, b),
            NormKind::NegInf => nan_min(a, b),
            _ => a + b,
        }
    }

    /// Turns a tensor's reduced value (sum of `|x|^p`, max, count) into its norm.
    pub fn finish(self, reduced: f64) -> f64 {
        match self {
            NormKind::Zero | NormKind::One | NormKind::Inf | NormKind::NegInf => reduced,
            NormKind::Two => reduced.sqrt(),
            NormKind::P(p) => reduced.powf(1.0 / p),
        }
    }

    /// The per-element contribution of a norm value when norms are themselves reduced (the total
    /// norm is the norm of the per-tensor norms, as in PyTorch's `clip_grad_norm_`).
    pub fn element(self, x: f64) -> f64 {
        let a = x.abs();
        match self {
            NormKind::Zero => {
                if a != 0.0 {
                    1.0
                } else {
                    0.0
                }
            }
            NormKind::One | NormKind::Inf | NormKind::NegInf => a,
            NormKind::Two => a * a,
            NormKind::P(p) => a.powf(p),
        }
    }

    /// The norm of a list of values (used for the total over per-tensor norms).
    pub fn norm_of(self, values: &[f64]) -> f64 {
        let reduced = values.iter().fold(self.identity(), |acc, &v| {
            self.combine(acc, self.element(v))
        });
        self.finish(reduced)
    }
}

/// `max` that returns NaN when either side is NaN (PyTorch's `max`).
pub fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b > a {
        if a.is_nan() {
            a
        } else {
            b
        }
    } else if b.is_nan() {
        b
    } else {
        a
    }
}

/// `min` that returns NaN when either side is NaN.
pub fn nan_min(a: f64, b: f64) -> f64 {
    -nan_max(-a, -b)
}

/// The clip coefficient `min(max_norm / (total_norm + 1e-6), 1)`, NaN when `total_norm` is NaN
/// (PyTorch clamps with `torch.clamp`, which keeps NaN).
pub fn clip_coef(max_norm: f64, total_norm: f64) -> f64 {
    let coef = max_norm / (total_norm + 1e-6);
    if coef.is_nan() {
        coef
    } else {
        coef.min(1.0)
    }
}

/// A read-only view of one float tensor's elements.
#[derive(Debug, Clone, Copy)]
pub enum FloatSlice<'a> {
    /// `f32` elements.
    F32(&'a [f32]),
    /// `f64` elements.
    F64(&'a [f64]),
    /// `f16` elements.
    F16(&'a [f16]),
    /// `bf16` elements.
    BF16(&'a [bf16]),
}

/// A writable view of one float tensor's elements.
#[derive(Debug)]
pub enum FloatSliceMut<'a> {
    /// `f32` elements.
    F32(&'a mut [f32]),
    /// `f64` elements.
    F64(&'a mut [f64]),
    /// `f16` elements.
    F16(&'a mut [f16]),
    /// `bf16` elements.
    BF16(&'a mut [bf16]),
}

macro_rules! slice_common {
    ($ty:ident) => {
        impl $ty<'_> {
            /// Number of elements.
            pub fn len(&self) -> usize {
                match self {
                    $ty::F32(s) => s.len(),
                    $ty::F64(s) => s.len(),
                    $ty::F16(s) => s.len(),
                    $ty::BF16(s) => s.len(),
                }
            }

            /// True when there are no elements.
            pub fn is_empty(&self) -> bool {
                self.len() == 0
            }

            /// The element type.
            pub fn dtype(&self) -> DType {
                match self {
                    $ty::F32(_) => DType::F32,
                    $ty::F64(_) => DType::F64,
                    $ty::F16(_) => DType::F16,
                    $ty::BF16(_) => DType::BF16,
                }
            }
        }
    };
}
slice_common!(FloatSlice);
slice_common!(FloatSliceMut);

impl<'a> FloatSliceMut<'a> {
    /// Splits into consecutive pieces of at most `chunk_elems` elements (none when empty).
    pub fn into_chunks(self, chunk_elems: usize) -> Vec<FloatSliceMut<'a>> {
        let n = chunk_elems.max(1);
        match self {
            FloatSliceMut::F32(s) => s.chunks_mut(n).map(FloatSliceMut::F32).collect(),
            FloatSliceMut::F64(s) => s.chunks_mut(n).map(FloatSliceMut::F64).collect(),
            FloatSliceMut::F16(s) => s.chunks_mut(n).map(FloatSliceMut::F16).collect(),
            FloatSliceMut::BF16(s) => s.chunks_mut(n).map(FloatSliceMut::BF16).collect(),
        }
    }

    /// A read-only view of the same elements.
    pub fn as_slice(&self) -> FloatSlice<'_> {
        match self {
            FloatSliceMut::F32(s) => FloatSlice::F32(s),
            FloatSliceMut::F64(s) => FloatSlice::F64(s),
            FloatSliceMut::F16(s) => FloatSlice::F16(s),
            FloatSliceMut::BF16(s) => FloatSlice::BF16(s),
        }
    }
}

impl<'a> FloatSlice<'a> {
    /// The elements `start..start + len`.
    pub fn sub(&self, start: usize, len: usize) -> FloatSlice<'a> {
        let r = start..start + len;
        match *self {
            FloatSlice::F32(s) => FloatSlice::F32(&s[r]),
            FloatSlice::F64(s) => FloatSlice::F64(&s[r]),
            FloatSlice::F16(s) => FloatSlice::F16(&s[r]),
            FloatSlice::BF16(s) => FloatSlice::BF16(&s[r]),
        }
    }
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

    #[test]
    fn norm_kinds_and_clip_coef_follow_pytorch() {
        assert_eq!(NormKind::from_norm_type(2.0), Some(NormKind::Two));
        assert_eq!(NormKind::from_norm_type(f64::INFINITY), Some(NormKind::Inf));
        assert_eq!(NormKind::from_norm_type(3.0), Some(NormKind::P(3.0)));
        assert_eq!(NormKind::from_norm_type(f64::NAN), None);
        assert_eq!(NormKind::Two.norm_of(&[3.0, 4.0]), 5.0);
        assert_eq!(NormKind::One.norm_of(&[3.0, -4.0]), 7.0);
        assert_eq!(NormKind::Inf.norm_of(&[3.0, -4.0]), 4.0);
        assert!(NormKind::Inf.norm_of(&[f64::NAN, 4.0]).is_nan());
        assert!(NormKind::Inf.norm_of(&[4.0, f64::NAN]).is_nan());
        assert_eq!(NormKind::NegInf.norm_of(&[3.0, -4.0]), 3.0);
        assert_eq!(NormKind::Zero.norm_of(&[0.0, -4.0, 1.0]), 2.0);
        assert!((NormKind::P(3.0).norm_of(&[1.0, 2.0]) - 9f64.cbrt()).abs() < 1e-15);
        assert_eq!(clip_coef(1.0, 0.5), 1.0);
        assert_eq!(clip_coef(1.0, 4.0 - 1e-6), 0.25);
        assert!(clip_coef(1.0, f64::NAN).is_nan());
        assert_eq!(clip_coef(1.0, f64::INFINITY), 0.0);
    }
}
