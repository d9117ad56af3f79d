//! Element types ([`DType`]) and the [`Element`] trait that ties each one to its Rust type.
//!
//! Every buffer in kiln is a flat array of one element type. `F16`/`BF16` use the `half` crate;
//! `Bool` is stored one byte per element (0 or 1) like PyTorch's `torch.bool`. Kernels that do
//! arithmetic on the 16-bit floats compute in `f32` and round once per op, as PyTorch's CPU does.

use half::{bf16, f16};
use std::fmt;

/// The element type of a tensor, named as in PyTorch (`torch.float32` is `F32`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit IEEE float (`torch.float32`), the default.
    F32,
    /// 64-bit IEEE float (`torch.float64`), used for gradient checks.
    F64,
    /// 16-bit IEEE float (`torch.float16`).
    F16,
    /// bfloat16 (`torch.bfloat16`).
    BF16,
    /// 64-bit signed integer (`torch.int64`), the index type.
    I64,
    /// 8-bit unsigned integer (`torch.uint8`).
    U8,
    /// Boolean stored as one byte, 0 or 1 (`torch.bool`).
    Bool,
}

impl DType {
    /// Size of one element in bytes.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 | DType::Bool => 1,
        }
    }

    /// True for the floating-point types (the ones that can carry gradients).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// PyTorch's name for the type (`"float32"`, `"int64"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::Bool => "bool",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Rust type that is the storage of one [`DType`]. Conversions go through `f64`, which holds
/// every value of every kiln type exactly except `i64` beyond 2^53.
pub trait Element: Copy + Send + Sync + PartialOrd + fmt::Debug + 'static {
    /// The dtype this type stores.
    const DTYPE: DType;
    /// The value as `f64`.
    fn to_f64(self) -> f64;
    /// The value nearest to `v` (float to int truncates toward zero, saturating; to bool: != 0).
    fn from_f64(v: f64) -> Self;
    /// Zero.
    fn zero() -> Self;
    /// What debug builds fill an unfilled kernel output with before the kernel writes it
    /// (`HostBuffer::for_overwrite`): NaN for floats, a byte pattern no kernel produces by
    /// accident for the others, so an element a kernel misses fails the tests instead of
    /// passing with stale data.
    const POISON: Self;
}

macro_rules! element {
    ($t:ty, $dt:expr, $to:expr, $from:expr, $zero:expr, $poison:expr) => {
        impl Element for $t {
            const DTYPE: DType = $dt;
            const POISON: Self = $poison;
            #[inline]
            fn to_f64(self) -> f64 {
                ($to)(self)
            }
            #[inline]
            fn from_f64(v: f64) -> Self {
                ($from)(v)
            }
            #[inline]
            fn zero() -> Self {
                $zero
            }
        }
    };
}

element!(
    f32,
    DType::F32,
    |v: f32| v as f64,
    |v: f64| v as f32,
    0.0,
    f32::NAN
);
element!(f64, DType::F64, |v: f64| v, |v: f64| v, 0.0, f64::NAN);
element!(
    f16,
    DType::F16,
    |v: f16| v.to_f64(),
    f16::from_f64,
    f16::ZERO,
    f16::NAN
);
element!(
    bf16,
    DType::BF16,
    |v: bf16| v.to_f64(),
    bf16::from_f64,
    bf16::ZERO,
    bf16::NAN
);
element!(
    i64,
    DType::I64,
    |v: i64| v as f64,
    |v: f64| v as i64,
    0,
    0x5A5A_5A5A_5A5A_5A5A
);
element!(u8, DType::U8, |v: u8| v as f64, |v: f64| v as u8, 0, 0xA5);

/// The one-byte boolean element; a newtype over `u8` so `Bool` and `U8` buffers stay distinct.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
#[repr(transparent)]
pub struct BoolByte(pub u8);

element!(
    BoolByte,
    DType::Bool,
    |v: BoolByte| v.0 as f64,
    |v: f64| BoolByte((v != 0.0) as u8),
    BoolByte(0),
    BoolByte(0xA5)
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_conversions() {
        assert_eq!(DType::BF16.size_in_bytes(), 2);
        assert_eq!(DType::I64.size_in_bytes(), 8);
        assert_eq!(i64::from_f64(-2.7), -2);
        assert_eq!(BoolByte::from_f64(0.5), BoolByte(1));
        assert_eq!(f16::from_f64(1.5).to_f64(), 1.5);
        assert!(DType::BF16.is_float() && !DType::Bool.is_float());
    }
}
