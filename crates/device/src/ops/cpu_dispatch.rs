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
//! takes one block of the CPU caching allocator for it ([`HostBuffer::try_filled_with`]: zero
//! fill, then the kernel overwrites it) and wraps that block, so an op's result costs exactly
//! one allocator block and no `Vec` or copy. [`CpuStorage::from_vec`] (user data handed over as
//! a `Vec`) is the one path that still copies.
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

use crate::dtype::DType;
use crate::layout::Layout;
use crate::ops::strided::{cast_into, copy_contiguous_into};
use crate::ops::KernelError;
use crate::storage::{by_dtype, with_slice, HostBuffer, HostElement};
use crate::threads::cpu_pool;
use crate::{CpuStorage, Error, Result};
use half::{bf16, f16};

/// A new storage of `len` elements of `T`, written in place by `write` (a kernel taking its
/// output slice): one block of the CPU allocator, zero-filled first, no intermediate `Vec`.
pub(crate) fn output<T: HostElement>(
    len: usize,
    write: impl FnOnce(&mut [T]),
) -> Result<CpuStorage> {
    Ok(T::wrap(HostBuffer::try_filled_with(len, T::zero(), write)?))
}

/// A new `f32` buffer of `len` elements written by `write` (the `f32` result of a half-precision
/// op before it is rounded back).
pub(crate) fn f32_buffer(len: usize, write: impl FnOnce(&mut [f32])) -> Result<HostBuffer<f32>> {
    HostBuffer::try_filled_with(len, 0.0, write)
}

/// The unsupported-dtype error of `op`.
pub(crate) fn unsupported(op: &'static str, dtype: DType, hint: &'static str) -> Error {
    Error::UnsupportedDType { op, dtype, hint }
}

/// The hint of a float-only op given another dtype.
pub(crate) const FLOAT_HINT: &str = "convert with to_dtype(DType::F32) first";

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

/// The elements of `layout` widened to `f32`, contiguous, in a block of the CPU allocator
/// (the operand copy of a half-precision op computed in `f32`).
pub(crate) fn widen(s: &CpuStorage, layout: &Layout) -> Result<HostBuffer<f32>> {
    with_slice!(s, src => f32_buffer(layout.numel(), |out| cast_into(src, layout, out)))
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

/// `f32` results rounded once to `F16` or `BF16`, in a new storage.
pub(crate) fn round_to_half(wide: &HostBuffer<f32>, dtype: DType) -> Result<CpuStorage> {
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

/// Runs a float op natively on f32/f64 and through f32 on f16/bf16. `$body` writes the
/// `layout.numel()` outputs into `$out`.
macro_rules! float_op {
    ($self:expr, $layout:expr, $op:expr, |$s:ident, $l:ident, $out:ident| $body:expr) => {
        match $self {
            $crate::CpuStorage::F32(b) => {
                let ($s, $l) = (b.as_slice(), $layout);
                $crate::ops::cpu_dispatch::output::<f32>($l.numel(), |$out| $body)
            }
            $crate::CpuStorage::F64(b) => {
                let ($s, $l) = (b.as_slice(), $layout);
                $crate::ops::cpu_dispatch::output::<f64>($l.numel(), |$out| $body)
            }
            $crate::CpuStorage::F16(_) | $crate::CpuStorage::BF16(_) => {
                let wide = $crate::ops::cpu_dispatch::widen($self, $layout)?;
                let cl = $crate::Layout::contiguous($layout.shape());
                let ($s, $l) = (wide.as_slice(), &cl);
                let r = $crate::ops::cpu_dispatch::f32_buffer($l.numel(), |$out| $body)?;
                drop(wide);
                $crate::ops::cpu_dispatch::round_to_half(&r, $self.dtype())
            }
            other => Err($crate::ops::cpu_dispatch::unsupported(
                $op,
                other.dtype(),
                $crate::ops::cpu_dispatch::FLOAT_HINT,
            )),
        }
    };
}
pub(crate) use float_op;

/// Runs `$body` with `$T` the float type of `$dtype`: `f32`/`f64` natively; `f16`/`bf16` as
/// `f32` (operands widened by [`dense`], float results rounded back once by [`Narrow`]), as
/// PyTorch's CPU kernels do for half types. Other dtypes get an unsupported-dtype error.
macro_rules! float_kernel {
    ($op:expr, $dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            half @ ($crate::DType::F16 | $crate::DType::BF16) => {
                type $T = f32;
                #[allow(clippy::redundant_closure_call)]
                let wide = (|| $body)();
                wide.and_then(|r| $crate::ops::cpu_dispatch::Narrow::narrow(r, half))
            }
            other => Err($crate::Error::UnsupportedDType {
                op: $op,
                dtype: other,
                hint: "this kernel runs on floating-point tensors; convert with \
                       to_dtype(DType::F32) first",
            }),
        }
    };
}
pub(crate) use float_kernel;

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
            CpuStorage::F16(b) => Some(HostBuffer::try_filled_with(n, T::zero(), |out| {
                cast_into::<f16, T>(b.as_slice(), layout, out)
            })?),
            CpuStorage::BF16(b) => Some(HostBuffer::try_filled_with(n, T::zero(), |out| {
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
        None => Dense::Owned(HostBuffer::try_filled_with(n, T::zero(), |out| {
            copy_contiguous_into(data, layout, out)
        })?),
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

/// A zero-filled output of `shape` in a block of the CPU allocator; the kernel writes it in
/// place (accumulating kernels rely on the zeros).
pub(crate) fn zeros<T: HostElement>(shape: &[usize]) -> Result<HostBuffer<T>> {
    HostBuffer::filled(shape.iter().product(), T::zero())
}

/// The storage variant holding `buf`.
pub(crate) fn wrap<T: HostElement>(buf: HostBuffer<T>) -> CpuStorage {
    T::wrap(buf)
}

/// Runs a kernel in kiln's CPU pool.
pub(crate) fn in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    cpu_pool().install(f)
}
