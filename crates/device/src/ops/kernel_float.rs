//! The element types the CPU kernels are generic over.
//!
//! The heavy kernels (convolution, pooling, normalisation, indexing) are written once over
//! [`KernelFloat`], which `f32` and `f64` implement. `f64` exists for finite-difference gradient
//! checks; `f32` is the training type. Half-precision types (`f16`, `bf16`) are not kernel types
//! here: on CPU they are widened to `f32`, run, and narrowed again by the caller (batch norm's
//! kernels instead read and write them per element, computing in `f32`: see
//! `norm::cpu::NormElement`). The trait is sealed because the convolution kernels hand these types to the `gemm` crate, which only
//! accepts a fixed set of element types.
//!
//! Reductions inside the kernels (means, variances, bias gradients) accumulate in `f64` through
//! `Element::to_f64`, as PyTorch accumulates `float` reductions on CPU in `double`.
//!
//! `KernelFloat` is a sub-trait of the seam's float trait ([`Float`], itself an [`Element`](crate::Element)):
//! conversions (`to_f64`, `from_f64`) come from `Element` and `is_nan` from `Float`, so each
//! method has exactly one source and calls on a `T: KernelFloat` are never ambiguous. It adds
//! only what the heavy kernels need on top: compound assignment, `Sum`, and constants.

use crate::ops::elementwise::float::Float;
use std::iter::Sum;
use std::ops::{AddAssign, MulAssign, SubAssign};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// A floating-point element type the CPU kernels run on: `f32` or `f64`.
pub trait KernelFloat:
    sealed::Sealed + Float + Default + AddAssign + SubAssign + MulAssign + Sum
{
    /// Additive identity.
    const ZERO: Self;
    /// Multiplicative identity.
    const ONE: Self;
    /// Negative infinity (the identity of `max`).
    const NEG_INFINITY: Self;
}

impl KernelFloat for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INFINITY: Self = f32::NEG_INFINITY;
}

impl KernelFloat for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INFINITY: Self = f64::NEG_INFINITY;
}
