//! [`Float`]: the math kiln's float kernels need, for `f32` and `f64` (16-bit floats compute
//! through `f32`). `erf` comes from `libm`, since `std` has none on stable Rust.

use crate::dtype::Element;

/// Float arithmetic and the transcendental functions used by the kernels.
pub trait Float:
    Element
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Neg<Output = Self>
{
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
}

macro_rules! float_impl {
    ($t:ty, $erf:path) => {
        impl Float for $t {
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
        }
    };
}

float_impl!(f32, libm::erff);
float_impl!(f64, libm::erf);
