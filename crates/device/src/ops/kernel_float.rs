//! [`KernelFloat`]: the element types the CPU float kernels are generic over, `f32` and `f64`.
//!
//! Every float kernel (elementwise math, softmax, matmul, convolution, pooling, normalisation,
//! indexing, losses) is written once over this trait. `f64` exists for finite-difference
//! gradient checks; `f32` is the training type. Half-precision types (`f16`, `bf16`) are not
//! kernel types: on CPU they compute in `f32` (`crate::ops::cpu_dispatch`, batch norm per
//! element through `norm::cpu::NormElement`). The trait is sealed because matmul and the
//! convolution kernels hand these types to the `gemm` crate, which only accepts a fixed set of
//! element types. `erf` comes from `libm`, since `std` has none on stable Rust.
//!
//! Reductions inside the kernels (means, variances, bias gradients) accumulate in `f64` through
//! `Element::to_f64`, as PyTorch accumulates `float` reductions on CPU in `double`. Conversions
//! (`to_f64`, `from_f64`) come from [`Element`] only, so calls on a `T: KernelFloat` are never
//! ambiguous.

use crate::dtype::Element;
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
    + super::gemm::GemmFloat
    + Element
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + Default
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
    /// Whether the transcendental activations (`exp`, `tanh`, sigmoid, SiLU, tanh-GELU) are
    /// computed in `f64` by `activation_math`'s vectorisable formulas and rounded once (`f32`),
    /// rather than by libm (`f64`, which needs libm's last-place accuracy).
    const WIDE_ACTIVATIONS: bool;
    /// `v` converted.
    fn c(v: f64) -> Self;
    /// e^x
    fn exp(self) -> Self;
    /// ln x
    fn ln(self) -> Self;
    /// √x
    fn sqrt(self) -> Self;
    /// |x|
    fn abs(self) -> Self;
    /// tanh x
    fn tanh(self) -> Self;
    /// erf x
    fn erf(self) -> Self;
    /// x^y
    fn powf(self, y: Self) -> Self;
    /// NaN test
    fn is_nan(self) -> bool;
    /// `self * a + b`, rounded once (a fused multiply-add)
    fn mul_add(self, a: Self, b: Self) -> Self;
}

macro_rules! kernel_float_impl {
    ($t:ty, $erf:path, $wide:expr) => {
        impl KernelFloat for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
            const WIDE_ACTIVATIONS: bool = $wide;

            #[inline]
            fn c(v: f64) -> Self {
                v as $t
            }
            #[inline]
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            #[inline]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            #[inline]
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            #[inline]
            fn erf(self) -> Self {
                $erf(self)
            }
            #[inline]
            fn powf(self, y: Self) -> Self {
                <$t>::powf(self, y)
            }
            #[inline]
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            #[inline]
            fn mul_add(self, a: Self, b: Self) -> Self {
                <$t>::mul_add(self, a, b)
            }
        }
    };
}

kernel_float_impl!(f32, libm::erff, true);
kernel_float_impl!(f64, libm::erf, false);
