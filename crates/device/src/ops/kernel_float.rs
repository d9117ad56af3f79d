//! The element types the CPU kernels are generic over.
//!
//! The heavy kernels (convolution, pooling, normalisation, indexing) are written once over
//! [`KernelFloat`], which `f32` and `f64` implement. `f64` exists for finite-difference gradient
//! checks; `f32` is the training type. Half-precision types (`f16`, `bf16`) are not kernel types
//! here: on CPU they are widened to `f32`, run, and narrowed again by the caller. The trait is
//! sealed because the convolution kernels hand these types to the `gemm` crate, which only
//! accepts a fixed set of element types.
//!
//! Reductions inside the kernels (means, variances, bias gradients) accumulate in `f64` through
//! [`KernelFloat::to_f64`], as PyTorch accumulates `float` reductions on CPU in `double`.

use std::fmt::Debug;
use std::iter::Sum;
use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub, SubAssign};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// A floating-point element type the CPU kernels run on: `f32` or `f64`.
pub trait KernelFloat:
    sealed::Sealed
    + Copy
    + Debug
    + Default
    + PartialOrd
    + Send
    + Sync
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + Sum
{
    /// Additive identity.
    const ZERO: Self;
    /// Multiplicative identity.
    const ONE: Self;
    /// Negative infinity (the identity of `max`).
    const NEG_INFINITY: Self;

    /// Converts from `f64`, rounding to nearest.
    fn from_f64(value: f64) -> Self;
    /// Widens (or keeps) the value as `f64`.
    fn to_f64(self) -> f64;
    /// True when the value is NaN.
    fn is_nan(self) -> bool;
}

impl KernelFloat for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INFINITY: Self = f32::NEG_INFINITY;

    fn from_f64(value: f64) -> Self {
        value as f32
    }
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
}

impl KernelFloat for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INFINITY: Self = f64::NEG_INFINITY;

    fn from_f64(value: f64) -> Self {
        value
    }
    fn to_f64(self) -> f64 {
        self
    }
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
}
