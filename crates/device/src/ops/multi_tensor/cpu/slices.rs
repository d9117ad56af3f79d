//! Typed views of the float buffers the CPU multi-tensor kernels read and write.
//!
//! Invariants: a view covers exactly the elements of one dense tensor (a contiguous range of its
//! host buffer); only the four float dtypes have views; splitting a view never reorders or
//! overlaps its elements.

use crate::ops::multi_tensor::{Operand, OperandMut};
use crate::ops::{KernelError, KernelFloat};
use crate::storage::HostElement;
use crate::{CpuStorage, DType, Error, Layout, Result};
use half::{bf16, f16};

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
        }
    };
}
slice_common!(FloatSlice);
slice_common!(FloatSliceMut);

impl FloatSliceMut<'_> {
    /// The same elements, read-only.
    pub fn as_read(&self) -> FloatSlice<'_> {
        match self {
            FloatSliceMut::F32(s) => FloatSlice::F32(s),
            FloatSliceMut::F64(s) => FloatSlice::F64(s),
            FloatSliceMut::F16(s) => FloatSlice::F16(s),
            FloatSliceMut::BF16(s) => FloatSlice::BF16(s),
        }
    }
}

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

/// The elements `layout` covers in `buf`, or the error naming `op` when they lie past its end.
fn dense<T>(op: &'static str, buf: &[T], layout: &Layout) -> Result<std::ops::Range<usize>> {
    let start = layout.offset();
    let end = start + layout.numel();
    if end > buf.len() {
        return Err(KernelError::BufferLength {
            op,
            buffer: "operand",
            shape: layout.shape().to_vec(),
            expected: end,
            actual: buf.len(),
        }
        .into());
    }
    Ok(start..end)
}

fn not_float(op: &'static str, st: &CpuStorage) -> Error {
    Error::UnsupportedDType {
        op,
        dtype: st.dtype(),
        hint: "multi-tensor ops take float tensors (f32, f64, f16, bf16); convert with to_dtype",
    }
}

/// The elements of a dense float operand, read-only.
pub fn float_slice<'a>(
    op: &'static str,
    (st, layout): Operand<'a, CpuStorage>,
) -> Result<FloatSlice<'a>> {
    Ok(match st {
        CpuStorage::F32(b) => FloatSlice::F32(&b.as_slice()[dense(op, b.as_slice(), layout)?]),
        CpuStorage::F64(b) => FloatSlice::F64(&b.as_slice()[dense(op, b.as_slice(), layout)?]),
        CpuStorage::F16(b) => FloatSlice::F16(&b.as_slice()[dense(op, b.as_slice(), layout)?]),
        CpuStorage::BF16(b) => FloatSlice::BF16(&b.as_slice()[dense(op, b.as_slice(), layout)?]),
        other => return Err(not_float(op, other)),
    })
}

/// The elements of a dense float operand, writable.
pub fn float_slice_mut<'a>(
    op: &'static str,
    (st, layout): OperandMut<'a, CpuStorage>,
) -> Result<FloatSliceMut<'a>> {
    macro_rules! view {
        ($variant:ident, $b:expr) => {{
            let r = dense(op, $b.as_slice(), layout)?;
            FloatSliceMut::$variant(&mut $b.as_mut_slice()[r])
        }};
    }
    Ok(match st {
        CpuStorage::F32(b) => view!(F32, b),
        CpuStorage::F64(b) => view!(F64, b),
        CpuStorage::F16(b) => view!(F16, b),
        CpuStorage::BF16(b) => view!(BF16, b),
        other => return Err(not_float(op, other)),
    })
}

/// The elements of a dense operand holding `T` (another dtype is a dtype-mismatch error).
pub fn typed<'a, T: StepFloat>(
    op: &'static str,
    (st, layout): Operand<'a, CpuStorage>,
) -> Result<&'a [T]> {
    match T::slice(st) {
        Some(b) => Ok(&b[dense(op, b, layout)?]),
        None => Err(wrong_dtype::<T>(op, st.dtype())),
    }
}

/// The elements of a dense operand holding `T`, writable.
pub fn typed_mut<'a, T: StepFloat>(
    op: &'static str,
    (st, layout): OperandMut<'a, CpuStorage>,
) -> Result<&'a mut [T]> {
    let dtype = st.dtype();
    match T::slice_mut(st) {
        Some(b) => {
            let r = dense(op, b, layout)?;
            Ok(&mut b[r])
        }
        None => Err(wrong_dtype::<T>(op, dtype)),
    }
}

/// A float type the optimizer steps compute in (`f32`, `f64`): the kernel arithmetic of
/// [`KernelFloat`] plus the typed view of the host buffer holding it ([`HostElement`]).
pub(crate) trait StepFloat: KernelFloat + HostElement {}

impl<T: KernelFloat + HostElement> StepFloat for T {}

/// The error for an operand that does not hold the list's dtype `T`.
fn wrong_dtype<T: StepFloat>(op: &'static str, dtype: DType) -> Error {
    Error::DTypeMismatch {
        op,
        lhs: T::DTYPE,
        rhs: dtype,
    }
}

/// Checks that every buffer of one parameter (gradient, state) has the parameter's length.
pub fn same_len(op: &'static str, len: usize, others: &[usize]) -> Result<()> {
    match others.iter().find(|&&n| n != len) {
        None => Ok(()),
        Some(&n) => Err(Error::LengthMismatch {
            op,
            what: format!("a parameter has {len} elements but its gradient or state has {n}"),
        }),
    }
}
