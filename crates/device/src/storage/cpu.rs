//! [`CpuStorage`]: a host buffer of one dtype, the typed access to its variants
//! ([`HostElement`]) and the two dtype matches every CPU op starts from ([`with_slice!`],
//! [`by_dtype!`]).
//!
//! Invariants: the variant always matches the dtype of its [`HostBuffer`]; every element type is
//! plain old data (any byte pattern of the buffer's size is a valid buffer, `Bool` bytes are 0
//! or 1), so [`CpuStorage::as_bytes`] and [`CpuStorage::from_bytes`] round-trip exactly.

use super::host::HostBuffer;
use crate::dtype::{BoolByte, DType, Element};
use half::{bf16, f16};

/// A host buffer of one dtype.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum CpuStorage {
    /// `F32` elements.
    F32(HostBuffer<f32>),
    /// `F64` elements.
    F64(HostBuffer<f64>),
    /// `F16` elements.
    F16(HostBuffer<f16>),
    /// `BF16` elements.
    BF16(HostBuffer<bf16>),
    /// `I64` elements.
    I64(HostBuffer<i64>),
    /// `U8` elements.
    U8(HostBuffer<u8>),
    /// `Bool` elements (one byte each, 0 or 1).
    Bool(HostBuffer<BoolByte>),
}

/// Calls `$body` with `$s` bound to the typed slice of any variant.
macro_rules! with_slice {
    ($st:expr, $s:ident => $body:expr) => {
        match $st {
            $crate::CpuStorage::F32(b) => {
                let $s = b.as_slice();
                $body
            }
            $crate::CpuStorage::F64(b) => {
                let $s = b.as_slice();
                $body
            }
            $crate::CpuStorage::F16(b) => {
                let $s = b.as_slice();
                $body
            }
            $crate::CpuStorage::BF16(b) => {
                let $s = b.as_slice();
                $body
            }
            $crate::CpuStorage::I64(b) => {
                let $s = b.as_slice();
                $body
            }
            $crate::CpuStorage::U8(b) => {
                let $s = b.as_slice();
                $body
            }
            $crate::CpuStorage::Bool(b) => {
                let $s = b.as_slice();
                $body
            }
        }
    };
}

pub(crate) use with_slice;

/// Runs `$body` with `$T` the element type of `$dtype`.
macro_rules! by_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::DType::F16 => {
                type $T = ::half::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $T = ::half::bf16;
                $body
            }
            $crate::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::DType::U8 => {
                type $T = u8;
                $body
            }
            $crate::DType::Bool => {
                type $T = $crate::BoolByte;
                $body
            }
        }
    };
}

pub(crate) use by_dtype;

/// `v` as `Vec<U>` when `T` and `U` are the same type.
fn retype<T: 'static, U: 'static>(v: Vec<T>) -> Option<Vec<U>> {
    if std::any::TypeId::of::<T>() != std::any::TypeId::of::<U>() {
        return None;
    }
    let mut v = std::mem::ManuallyDrop::new(v);
    // SAFETY: T and U are the same type (checked above), so layout and drop are identical.
    Some(unsafe { Vec::from_raw_parts(v.as_mut_ptr() as *mut U, v.len(), v.capacity()) })
}

impl CpuStorage {
    /// A storage owning `data`.
    pub fn from_vec<T: Element>(data: Vec<T>) -> Self {
        by_dtype!(T::DTYPE, E => E::wrap(HostBuffer::from_vec(
            retype::<T, E>(data).expect("T::DTYPE names T's own variant"),
        )))
    }

    /// The elements as `Vec<T>` if the dtype is `T`'s.
    pub fn to_vec<T: Element>(&self) -> Option<Vec<T>> {
        with_slice!(self, s => retype(s.to_vec()))
    }

    /// Every element as `f64` (exact for every dtype but large `i64`).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        with_slice!(self, s => s.iter().map(|v| v.to_f64()).collect())
    }

    #[allow(clippy::unnecessary_cast)] // the macro instantiates u8 too
    /// The bytes of the buffer (native endianness), for device copies.
    pub fn as_bytes(&self) -> &[u8] {
        with_slice!(self, s => {
            // SAFETY: every element type is plain old data without padding.
            unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, std::mem::size_of_val(s)) }
        })
    }

    #[allow(clippy::unnecessary_cast)] // the macro instantiates u8 too
    /// A storage of `dtype` from raw bytes (length a multiple of the element size), copied
    /// straight into a block of the CPU allocator. Ends the process through
    /// `handle_alloc_error` when no block can be had, as the `Vec` it replaces would.
    pub fn from_bytes(bytes: &[u8], dtype: DType) -> Self {
        by_dtype!(dtype, E => {
            let n = bytes.len() / std::mem::size_of::<E>();
            let mut buf = HostBuffer::scratch(n, E::zero());
            // SAFETY: `buf` has room for exactly `n * size_of::<E>()` bytes, all patterns valid
            // for the float/int types; Bool bytes come from a Bool buffer.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.as_mut_slice().as_mut_ptr() as *mut u8, n * std::mem::size_of::<E>()) };
            E::wrap(buf)
        })
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            CpuStorage::F32(_) => DType::F32,
            CpuStorage::F64(_) => DType::F64,
            CpuStorage::F16(_) => DType::F16,
            CpuStorage::BF16(_) => DType::BF16,
            CpuStorage::I64(_) => DType::I64,
            CpuStorage::U8(_) => DType::U8,
            CpuStorage::Bool(_) => DType::Bool,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        with_slice!(self, s => s.len())
    }

    /// True when the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Address of the allocator block behind the buffer (`None` when empty).
    pub fn block_addr(&self) -> Option<u64> {
        match self {
            CpuStorage::F32(b) => b.block_addr(),
            CpuStorage::F64(b) => b.block_addr(),
            CpuStorage::F16(b) => b.block_addr(),
            CpuStorage::BF16(b) => b.block_addr(),
            CpuStorage::I64(b) => b.block_addr(),
            CpuStorage::U8(b) => b.block_addr(),
            CpuStorage::Bool(b) => b.block_addr(),
        }
    }
}

/// A Rust element type with typed access to its [`CpuStorage`] variant.
pub(crate) trait HostElement: Element {
    /// The elements, when `s` holds this type.
    fn slice(s: &CpuStorage) -> Option<&[Self]>;
    /// The elements, mutable, when `s` holds this type.
    fn slice_mut(s: &mut CpuStorage) -> Option<&mut [Self]>;
    /// The storage variant holding `buf`.
    fn wrap(buf: HostBuffer<Self>) -> CpuStorage;
}

macro_rules! host_element {
    ($t:ty, $variant:ident) => {
        impl HostElement for $t {
            fn slice(s: &CpuStorage) -> Option<&[Self]> {
                match s {
                    CpuStorage::$variant(b) => Some(b.as_slice()),
                    _ => None,
                }
            }
            fn slice_mut(s: &mut CpuStorage) -> Option<&mut [Self]> {
                match s {
                    CpuStorage::$variant(b) => Some(b.as_mut_slice()),
                    _ => None,
                }
            }
            fn wrap(buf: HostBuffer<Self>) -> CpuStorage {
                CpuStorage::$variant(buf)
            }
        }
    };
}

host_element!(f32, F32);
host_element!(f64, F64);
host_element!(f16, F16);
host_element!(bf16, BF16);
host_element!(i64, I64);
host_element!(u8, U8);
host_element!(BoolByte, Bool);
