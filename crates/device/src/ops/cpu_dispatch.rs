//! The CPU dtype dispatch: how a [`CpuStorage`]'s dtype picks a typed kernel, how operands are
//! read as slices, and how outputs are written. Every op family's `cpu.rs` goes through it.
//!
//! **Float kernels** are written for `f32`/`f64`; `F16`/`BF16` inputs are widened to `f32`,
//! computed, and rounded back once (what PyTorch's CPU kernels do for half types): whole-tensor
//! ops through [`float_op!`], the neural-network and index kernels through [`float_kernel!`]
//! (operands widened by [`dense`], float results rounded by [`Narrow`]). Copy-only kernels take
//! every dtype ([`crate::storage::by_dtype!`]). Every operand must have the first operand's
//! dtype (indices: `I64`), else the error names both.
//!
//! **Outputs are written in place.** Every kernel takes its output as `&mut [T]`; the storage
//! takes one block of the CPU caching allocator for it and wraps that block, so an op's result
//! costs exactly one allocator block and no `Vec` or copy. A kernel that writes every output
//! element gets the block unfilled ([`output`], [`buffer_of`], [`for_overwrite`]:
//! [`HostBuffer::for_overwrite`], poisoned in debug builds so a missed element fails the
//! tests); an accumulating kernel gets it zero-filled ([`zeros`]). [`CpuStorage::from_vec`]
//! (user data handed over as a `Vec`) is the one path that still copies.
//!
//! **What the allocator's statistics see during an op** (`memory_allocated`,
//! `max_memory_allocated`, `memory_stats` of `Device::Cpu`):
//! - counted: every output block; the large scratch of the kernels, which also comes from the
//!   allocator and is freed before the op returns: dense copies of non-contiguous operands in
//!   the nn ops ([`dense`]), the widened `f32` operands and `f32` results of `F16`/`BF16` ops,
//!   conv2d's im2col columns (one per rayon task) and its per-thread partial weight gradients.
//!   So `max_memory_allocated` is the real peak of tensor-sized memory.
//! - not counted (system allocator): `gemm`'s internal packing buffers, and small per-op
//!   bookkeeping (layouts, per-batch offsets, index coordinates, per-column or per-class `f64`
//!   accumulators in norm and loss kernels, index-frequency counts), all far smaller than the
//!   tensors involved; the cross-entropy kernel's class-index targets converted to `i64` (a
//!   `Vec`); plus whatever the caller itself allocates.
//!
//! Each nn kernel reads its operands as dense slices (borrowed when the layout is already a
//! contiguous run of the buffer, copied otherwise), runs inside kiln's CPU thread pool (so
//! `KILN_NUM_THREADS` caps it) and wraps the result in a fresh [`CpuStorage`].

use crate::dtype::{DType, Element};
use crate::layout::Layout;
use crate::ops::strided::{cast_into, copy_contiguous_into};
use crate::ops::KernelError;
use crate::storage::{by_dtype, with_slice, HostBuffer, HostElement};
use crate::{CpuStorage, Error, Result};
use half::{bf16, f16};
use std::borrow::Cow;

/// A new storage of `len` elements of `T`, written in place by `write` (a kernel that writes
/// every element of its output slice): one unfilled block of the CPU allocator, no
/// intermediate `Vec`.
pub(crate) fn output<T: HostElement>(
    len: usize,
    write: impl FnOnce(&mut [T]),
) -> Result<CpuStorage> {
    Ok(T::wrap(buffer_of(len, write)?))
}

/// The unsupported-dtype error of `op`.
pub(crate) fn unsupported(op: &'static str, dtype: DType, hint: &'static str) -> Error {
    Error::UnsupportedDType { op, dtype, hint }
}

/// The hint of a float-only op given another dtype (also what kiln-autograd's ops that check
/// a dtype before reaching a kernel say).
pub const FLOAT_HINT: &str = "convert with to_dtype(DType::F32) first";

/// A dtype-mismatch error unless `a` and `b` have one dtype.
pub(crate) fn same_dtype(op: &'static str, a: &CpuStorage, b: &CpuStorage) -> Result<()> {
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch {
            op,
            lhs: a.dtype(),
            rhs: b.dtype(),
        });
    }
    Ok(())
}

/// The elements of `layout` converted to `dtype`, contiguous, in a new storage.
pub(crate) fn cast(s: &CpuStorage, layout: &Layout, dtype: DType) -> Result<CpuStorage> {
    with_slice!(s, src => by_dtype!(dtype, E => output::<E>(layout.numel(), |out| {
        cast_into(src, layout, out)
    })))
}

/// A byte view of a Bool or U8 storage (for conditions and masks).
pub(crate) fn as_condition<'a>(s: &'a CpuStorage, op: &'static str) -> Result<&'a [u8]> {
    match s {
        CpuStorage::Bool(b) => {
            let s = b.as_slice();
            // SAFETY: BoolByte is repr(transparent) over u8.
            Ok(unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, s.len()) })
        }
        CpuStorage::U8(b) => Ok(b.as_slice()),
        other => Err(unsupported(
            op,
            other.dtype(),
            "the condition must be a bool tensor (e.g. from a comparison)",
        )),
    }
}

/// **The 16-bit rule, stated once.** Runs `$body` with `$T` the compute type and `$X` the
/// element type of `$dtype`: `(f32, f32)`, `(f64, f64)`, `(f32, f16)`, `(f32, bf16)` (what
/// PyTorch's CPU kernels do for half types); any other dtype is `UnsupportedDType { op, hint }`.
/// How the elements move between `$X` and `$T` is up to the caller: whole operands widened and
/// results rounded once ([`float_op!`], [`float_kernel!`]), or each element widened as it is
/// read and rounded as it is written (batch norm's `NormElement`).
macro_rules! float_dispatch {
    ($op:expr, $dtype:expr, $hint:expr, ($T:ident, $X:ident) => $body:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $T = f32;
                type $X = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                type $X = f64;
                $body
            }
            $crate::DType::F16 => {
                type $T = f32;
                type $X = ::half::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $T = f32;
                type $X = ::half::bf16;
                $body
            }
            other => Err($crate::Error::UnsupportedDType {
                op: $op,
                dtype: other,
                hint: $hint,
            }),
        }
    };
}
pub(crate) use float_dispatch;

/// A whole-tensor float op through [`float_dispatch!`]: `$body` writes the `layout.numel()`
/// outputs into `$out` from the slice `$s` read through the layout `$l` ([`read_as`]: f32/f64
/// on the storage's own buffer and layout, f16/bf16 on a contiguous `f32` copy, whose `f32`
/// results are rounded once to the input dtype by [`finish_round`]).
macro_rules! float_op {
    ($self:expr, $layout:expr, $op:expr, |$s:ident, $l:ident, $out:ident| $body:expr) => {
        $crate::ops::cpu_dispatch::float_dispatch!(
            $op,
            $self.dtype(),
            $crate::ops::cpu_dispatch::FLOAT_HINT,
            (T, X) => {
                use $crate::ops::cpu_dispatch as dispatch;
                let (operand, operand_layout) = dispatch::read_as::<T>($self, $layout)?;
                let ($s, $l) = (&*operand, &*operand_layout);
                let computed = dispatch::buffer_of::<T>($l.numel(), |$out| $body)?;
                drop(operand);
                dispatch::finish_round::<T, X>(computed)
            }
        )
    };
}
pub(crate) use float_op;

/// An nn kernel through [`float_dispatch!`]: `$body` runs with `$T` the compute type (operands
/// read with [`dense`], which widens 16-bit ones), and for f16/bf16 inputs every `F32` buffer of
/// its result is rounded once to the input dtype ([`Narrow`]; index buffers stay `I64`).
macro_rules! float_kernel {
    ($op:expr, $dtype:expr, $T:ident => $body:expr) => {
        $crate::ops::cpu_dispatch::float_dispatch!(
            $op,
            $dtype,
            "this kernel runs on floating-point tensors; convert with to_dtype(DType::F32) first",
            ($T, X) => {
                #[allow(clippy::redundant_closure_call)]
                let computed = (|| $body)();
                $crate::ops::cpu_dispatch::round_results::<X, _>(computed)
            }
        )
    };
}
pub(crate) use float_kernel;

/// A kernel's result computed for element type `X`: unchanged for f32/f64, its `F32` buffers
/// rounded to `X` for f16/bf16.
pub(crate) fn round_results<X: Element, R: Narrow>(computed: Result<R>) -> Result<R> {
    match X::DTYPE {
        DType::F16 | DType::BF16 => computed.and_then(|r| r.narrow(X::DTYPE)),
        _ => computed,
    }
}

/// A new buffer of `len` elements of `T` written by `write`, which writes every element (also a
/// result computed in `T` before it is rounded to its dtype).
pub(crate) fn buffer_of<T: HostElement>(
    len: usize,
    write: impl FnOnce(&mut [T]),
) -> Result<HostBuffer<T>> {
    let mut buf = HostBuffer::for_overwrite(len)?;
    write(buf.as_mut_slice());
    Ok(buf)
}

/// The elements of `layout` converted to `T`, contiguous, in a block of the CPU allocator (the
/// widened operand copy of a half-precision op computed in `T`).
pub(crate) fn widen_as<T: HostElement>(s: &CpuStorage, layout: &Layout) -> Result<HostBuffer<T>> {
    with_slice!(s, src => buffer_of::<T>(layout.numel(), |out| cast_into(src, layout, out)))
}

/// An operand of a whole-tensor op computed in `T`, and the layout to read it through: the
/// storage's own buffer and `layout` when it holds `T` (no copy of either), else its elements
/// widened to `T` in a contiguous copy.
pub(crate) fn read_as<'a, 'l, T: HostElement>(
    s: &'a CpuStorage,
    layout: &'l Layout,
) -> Result<(Dense<'a, T>, Cow<'l, Layout>)> {
    match T::slice(s) {
        Some(native) => Ok((Dense::Borrowed(native), Cow::Borrowed(layout))),
        None => Ok((
            Dense::Owned(widen_as::<T>(s, layout)?),
            Cow::Owned(Layout::contiguous(layout.shape())),
        )),
    }
}

/// The result of an op computed in `T` as a storage of `X`: the buffer itself when `X` is `T`,
/// else rounded once to `X` as `to_dtype` rounds (`Element::from_f64`; binary ops, matmul).
pub(crate) fn finish_cast<T: HostElement, X: Element>(
    computed: HostBuffer<T>,
) -> Result<CpuStorage> {
    let computed = T::wrap(computed);
    if X::DTYPE == T::DTYPE {
        return Ok(computed);
    }
    let n = computed.len();
    cast(&computed, &Layout::contiguous(&[n]), X::DTYPE)
}

/// Like [`finish_cast`], rounding `f32` results with `f16::from_f32` / `bf16::from_f32` (unary
/// ops, softmax). The two roundings differ only for bf16 results that are f32 subnormals.
pub(crate) fn finish_round<T: HostElement, X: Element>(
    computed: HostBuffer<T>,
) -> Result<CpuStorage> {
    match (T::wrap(computed), X::DTYPE) {
        (CpuStorage::F32(wide), half @ (DType::F16 | DType::BF16)) => round_to_half(&wide, half),
        (computed, _) => Ok(computed),
    }
}

/// `f32` results rounded once to `F16` or `BF16`, in a new storage.
fn round_to_half(wide: &HostBuffer<f32>, dtype: DType) -> Result<CpuStorage> {
    let wide = wide.as_slice();
    match dtype {
        DType::F16 => output::<f16>(wide.len(), |out| {
            out.iter_mut()
                .zip(wide)
                .for_each(|(o, &v)| *o = f16::from_f32(v))
        }),
        _ => output::<bf16>(wide.len(), |out| {
            out.iter_mut()
                .zip(wide)
                .for_each(|(o, &v)| *o = bf16::from_f32(v))
        }),
    }
}

/// Results of a half-precision call computed in `f32`: every `F32` buffer is rounded to the
/// call's dtype (index buffers stay `I64`).
pub(crate) trait Narrow: Sized {
    /// The result with its `F32` buffers rounded to `dtype`.
    fn narrow(self, dtype: DType) -> Result<Self>;
}

impl Narrow for CpuStorage {
    fn narrow(self, dtype: DType) -> Result<Self> {
        if self.dtype() != DType::F32 {
            return Ok(self);
        }
        let n = self.len();
        cast(&self, &Layout::contiguous(&[n]), dtype)
    }
}

impl<S: Narrow> Narrow for Option<S> {
    fn narrow(self, dtype: DType) -> Result<Self> {
        self.map(|s| s.narrow(dtype)).transpose()
    }
}

impl<S: Narrow, const N: usize> Narrow for [S; N] {
    fn narrow(self, dtype: DType) -> Result<Self> {
        let mut out = Vec::with_capacity(N);
        for s in self {
            out.push(s.narrow(dtype)?);
        }
        Ok(out
            .try_into()
            .unwrap_or_else(|_| unreachable!("N elements in, N out")))
    }
}

impl<A: Narrow, B: Narrow> Narrow for (A, B) {
    fn narrow(self, dtype: DType) -> Result<Self> {
        Ok((self.0.narrow(dtype)?, self.1.narrow(dtype)?))
    }
}

impl Narrow for crate::seam::InputGrads<CpuStorage> {
    fn narrow(self, dtype: DType) -> Result<Self> {
        Ok(crate::seam::InputGrads {
            input: self.input.narrow(dtype)?,
            weight: self.weight.narrow(dtype)?,
            bias: self.bias.narrow(dtype)?,
        })
    }
}

/// An operand as a dense row-major slice: borrowed from its storage, or a contiguous copy in a
/// scratch block of the CPU allocator (counted by its statistics while the op runs).
pub(crate) enum Dense<'a, T: Copy> {
    /// A contiguous run of the operand's own buffer.
    Borrowed(&'a [T]),
    /// A contiguous (or widened) copy.
    Owned(HostBuffer<T>),
}

impl<T: Copy> std::ops::Deref for Dense<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Dense::Borrowed(s) => s,
            Dense::Owned(b) => b.as_slice(),
        }
    }
}

impl<T: Copy> Dense<'_, T> {
    /// An owned buffer of the elements (a copy into a new block when borrowed).
    pub(crate) fn into_owned(self) -> Result<HostBuffer<T>> {
        match self {
            Dense::Borrowed(s) => HostBuffer::try_from_slice(s),
            Dense::Owned(b) => Ok(b),
        }
    }
}

/// The elements of `layout` as a dense row-major slice of `T` (borrowed when possible). An
/// `F16`/`BF16` buffer read as `f32` is widened (a copy).
pub(crate) fn dense<'a, T: HostElement>(
    op: &'static str,
    x: (&'a CpuStorage, &Layout),
) -> Result<Dense<'a, T>> {
    let (s, layout) = x;
    let n = layout.numel();
    if T::DTYPE == DType::F32 {
        let widened = match s {
            CpuStorage::F16(b) => Some(buffer_of(n, |out| {
                cast_into::<f16, T>(b.as_slice(), layout, out)
            })?),
            CpuStorage::BF16(b) => Some(buffer_of(n, |out| {
                cast_into::<bf16, T>(b.as_slice(), layout, out)
            })?),
            _ => None,
        };
        if let Some(w) = widened {
            return Ok(Dense::Owned(w));
        }
    }
    let data = T::slice(s).ok_or(Error::DTypeMismatch {
        op,
        lhs: T::DTYPE,
        rhs: s.dtype(),
    })?;
    Ok(match layout.contiguous_offset() {
        Some(o) => Dense::Borrowed(&data[o..o + n]),
        None => Dense::Owned(buffer_of(n, |out| copy_contiguous_into(data, layout, out))?),
    })
}

/// A contiguous view of a buffer written in place (running statistics).
pub(crate) fn dense_mut<'a, T: HostElement>(
    op: &'static str,
    x: (&'a mut CpuStorage, &Layout),
) -> Result<&'a mut [T]> {
    let (s, layout) = x;
    let dtype = s.dtype();
    let data = T::slice_mut(s).ok_or(Error::DTypeMismatch {
        op,
        lhs: T::DTYPE,
        rhs: dtype,
    })?;
    match layout.contiguous_offset() {
        Some(o) => Ok(&mut data[o..o + layout.numel()]),
        None => Err(KernelError::InvalidShape {
            op,
            shape: layout.shape().to_vec(),
            rule: "a buffer updated in place must be contiguous; pass a contiguous tensor".into(),
        }
        .into()),
    }
}

/// `Option<Strided>` as an optional dense slice.
pub(crate) fn dense_opt<'a, T: HostElement>(
    op: &'static str,
    x: Option<(&'a CpuStorage, &Layout)>,
) -> Result<Option<Dense<'a, T>>> {
    x.map(|x| dense(op, x)).transpose()
}

/// A zero-filled output of `shape` in a block of the CPU allocator, for a kernel that
/// accumulates into it.
pub(crate) fn zeros<T: HostElement>(shape: &[usize]) -> Result<HostBuffer<T>> {
    HostBuffer::filled(output_numel(shape)?, T::zero())
}

/// The element count of an output of `shape`, checked: a shape computed from hostile settings
/// (a huge padding) must be an error, not a wrapped count.
fn output_numel(shape: &[usize]) -> Result<usize> {
    crate::layout::checked_size("allocate an output", "its element count", shape)
}

/// An unfilled output of `shape` in a block of the CPU allocator, for a kernel that writes every
/// element ([`HostBuffer::for_overwrite`]).
pub(crate) fn for_overwrite<T: HostElement>(shape: &[usize]) -> Result<HostBuffer<T>> {
    HostBuffer::for_overwrite(output_numel(shape)?)
}

/// The storage variant holding `buf`.
pub(crate) fn wrap<T: HostElement>(buf: HostBuffer<T>) -> CpuStorage {
    T::wrap(buf)
}

/// Runs a kernel in kiln's CPU pool.
pub(crate) fn in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    crate::threads::install(f)
}
