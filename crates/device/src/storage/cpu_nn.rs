//! The CPU side of the neural-network and indexing methods of the backend seam: convolution,
//! pooling, normalisation and the index ops, on top of the slice kernels in
//! `crate::ops::{conv, pool, norm, index}`.
//!
//! The index ops live in the `index` submodule, batch norm in `batch_norm` (which reads and
//! writes f16/bf16 tensors per element and takes PyTorch's mixed 16-bit input with f32
//! parameters, so two of its rules below differ; see there). Each function reads its operands as dense slices (borrowed when the layout is already a
//! contiguous run of the buffer, copied otherwise), picks the element type from the first
//! operand, runs the kernel inside kiln's CPU thread pool (so `KILN_NUM_THREADS` caps it) and
//! wraps the result in a fresh [`CpuStorage`]. The float kernels run on `f32` and `f64` only;
//! copy-only kernels (`index_select`, `gather`, `scatter`, `embedding` lookup) take every dtype.
//! Every operand must have the first operand's dtype (indices: `I64`), else the error names both.

use super::cpu::CpuStorage;
use super::host::HostBuffer;
use crate::backend::{GradMask, Grads3, Pool2d, Strided};
use crate::dtype::{BoolByte, DType, Element};
use crate::ops::conv::{cpu as conv, Conv2dGeometry};
use crate::ops::copy::cpu::{cast_into, copy_contiguous_into};
use crate::ops::norm::{cpu as norm, Affine, LayerNormShape, NormGrads, SavedStats, SavedStatsMut};
use crate::ops::pool::cpu as pool;
use crate::ops::KernelError;
use crate::threads::cpu_pool;
use crate::{BackendStorage, Error, Layout, Result};
use half::{bf16, f16};

/// A Rust element type with typed access to its [`CpuStorage`] variant.
pub(super) trait HostElement: Element {
    fn slice(s: &CpuStorage) -> Option<&[Self]>;
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

/// Runs `$body` with `$T` the float type of `$dtype`: `f32`/`f64` natively; `f16`/`bf16` as
/// `f32` (operands widened by [`dense`], float results rounded back once by [`Narrow`]), as
/// PyTorch's CPU kernels do for half types. Other dtypes get an unsupported-dtype error.
macro_rules! float_kernel {
    ($op:expr, $dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F64 => {
                type $T = f64;
                $body
            }
            half @ (DType::F16 | DType::BF16) => {
                type $T = f32;
                #[allow(clippy::redundant_closure_call)]
                let wide = (|| $body)();
                wide.and_then(|r| $crate::storage::cpu_nn::Narrow::narrow(r, half))
            }
            other => Err(Error::UnsupportedDType {
                op: $op,
                dtype: other,
                hint: "this kernel runs on floating-point tensors; convert with \
                       to_dtype(DType::F32) first",
            }),
        }
    };
}

/// Runs `$body` with `$T` the element type of `$dtype` (any dtype).
macro_rules! any_kernel {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F64 => {
                type $T = f64;
                $body
            }
            DType::F16 => {
                type $T = f16;
                $body
            }
            DType::BF16 => {
                type $T = bf16;
                $body
            }
            DType::I64 => {
                type $T = i64;
                $body
            }
            DType::U8 => {
                type $T = u8;
                $body
            }
            DType::Bool => {
                type $T = BoolByte;
                $body
            }
        }
    };
}

/// Results of a half-precision call computed in `f32`: every `F32` buffer is rounded to the
/// call's dtype (index buffers stay `I64`).
trait Narrow: Sized {
    fn narrow(self, dtype: DType) -> Result<Self>;
}

impl Narrow for CpuStorage {
    fn narrow(self, dtype: DType) -> Result<Self> {
        if self.dtype() != DType::F32 {
            return Ok(self);
        }
        let n = self.len();
        self.to_dtype(&Layout::contiguous(&[n]), dtype)
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

/// An operand as a dense row-major slice: borrowed from its storage, or a contiguous copy in a
/// scratch block of the CPU allocator (counted by its statistics while the op runs).
pub(super) enum Dense<'a, T: Copy> {
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
    fn into_owned(self) -> Result<HostBuffer<T>> {
        match self {
            Dense::Borrowed(s) => HostBuffer::try_from_slice(s),
            Dense::Owned(b) => Ok(b),
        }
    }
}

/// The elements of `layout` as a dense row-major slice of `T` (borrowed when possible). An
/// `F16`/`BF16` buffer read as `f32` is widened (a copy).
fn dense<'a, T: HostElement>(op: &'static str, x: Strided<'a, CpuStorage>) -> Result<Dense<'a, T>> {
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
fn dense_mut<'a, T: HostElement>(
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
fn dense_opt<'a, T: HostElement>(
    op: &'static str,
    x: Option<Strided<'a, CpuStorage>>,
) -> Result<Option<Dense<'a, T>>> {
    x.map(|x| dense(op, x)).transpose()
}

/// A zero-filled output of `shape` in a block of the CPU allocator; the kernel writes it in
/// place (accumulating kernels rely on the zeros).
fn zeros<T: HostElement>(shape: &[usize]) -> Result<HostBuffer<T>> {
    HostBuffer::filled(shape.iter().product(), T::zero())
}

fn wrap<T: HostElement>(buf: HostBuffer<T>) -> CpuStorage {
    T::wrap(buf)
}

/// Runs a kernel in kiln's CPU pool.
fn in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    cpu_pool().install(f)
}

pub(super) fn conv2d(
    x: Strided<'_, CpuStorage>,
    weight: Strided<'_, CpuStorage>,
    bias: Option<Strided<'_, CpuStorage>>,
    g: &Conv2dGeometry,
) -> Result<CpuStorage> {
    const OP: &str = "conv2d";
    float_kernel!(OP, x.0.dtype(), T => {
        let (input, w, b) = (dense::<T>(OP, x)?, dense::<T>(OP, weight)?, dense_opt::<T>(OP, bias)?);
        let mut out = zeros::<T>(&g.output_shape())?;
        in_pool(|| conv::conv2d_forward(g, &input, &w, b.as_deref(), &mut out))?;
        Ok(wrap(out))
    })
}

pub(super) fn conv2d_backward(
    grad: Strided<'_, CpuStorage>,
    x: Strided<'_, CpuStorage>,
    weight: Strided<'_, CpuStorage>,
    g: &Conv2dGeometry,
    mask: GradMask,
) -> Result<Grads3<CpuStorage>> {
    const OP: &str = "conv2d_backward";
    float_kernel!(OP, grad.0.dtype(), T => {
        let go = dense::<T>(OP, grad)?;
        let mut out: Grads3<CpuStorage> = [None, None, None];
        if mask[0] {
            let w = dense::<T>(OP, weight)?;
            let mut gi = zeros::<T>(&g.input_shape())?;
            in_pool(|| conv::conv2d_backward_input(g, &go, &w, &mut gi))?;
            out[0] = Some(wrap(gi));
        }
        if mask[1] {
            let input = dense::<T>(OP, x)?;
            let mut gw = zeros::<T>(&g.weight_shape())?;
            in_pool(|| conv::conv2d_backward_weight(g, &input, &go, &mut gw))?;
            out[1] = Some(wrap(gw));
        }
        if mask[2] {
            let mut gb = zeros::<T>(&[g.out_channels])?;
            in_pool(|| conv::conv2d_backward_bias(g, &go, &mut gb))?;
            out[2] = Some(wrap(gb));
        }
        Ok(out)
    })
}

pub(super) fn pool2d(
    x: Strided<'_, CpuStorage>,
    p: &Pool2d,
) -> Result<(CpuStorage, Option<CpuStorage>)> {
    const OP: &str = "pool2d";
    float_kernel!(OP, x.0.dtype(), T => {
        let input = dense::<T>(OP, x)?;
        match p {
            Pool2d::Max(g) => {
                let mut out = zeros::<T>(&g.shape.output_shape())?;
                let mut idx = zeros::<i64>(&g.shape.output_shape())?;
                in_pool(|| pool::max_pool2d_forward(g, &input, &mut out, &mut idx))?;
                Ok((wrap(out), Some(wrap(idx))))
            }
            Pool2d::Avg(g) => {
                let mut out = zeros::<T>(&g.shape.output_shape())?;
                in_pool(|| pool::avg_pool2d_forward(g, &input, &mut out))?;
                Ok((wrap(out), None))
            }
            Pool2d::AdaptiveAvg(g) => {
                let mut out = zeros::<T>(&g.shape.output_shape())?;
                in_pool(|| pool::adaptive_avg_pool2d_forward(g, &input, &mut out))?;
                Ok((wrap(out), None))
            }
        }
    })
}

pub(super) fn pool2d_backward(
    grad: Strided<'_, CpuStorage>,
    indices: Option<Strided<'_, CpuStorage>>,
    p: &Pool2d,
) -> Result<CpuStorage> {
    const OP: &str = "pool2d_backward";
    float_kernel!(OP, grad.0.dtype(), T => {
        let go = dense::<T>(OP, grad)?;
        match p {
            Pool2d::Max(g) => {
                let Some(indices) = indices else {
                    return Err(Error::LengthMismatch {
                        op: "max_pool2d_backward",
                        what: "got no indices buffer, but max pooling's backward needs the \
                               indices its forward returned"
                            .into(),
                    });
                };
                let idx = dense::<i64>(OP, indices)?;
                let mut gi = zeros::<T>(&g.shape.input_shape())?;
                in_pool(|| pool::max_pool2d_backward(g, &go, &idx, &mut gi))?;
                Ok(wrap(gi))
            }
            Pool2d::Avg(g) => {
                let mut gi = zeros::<T>(&g.shape.input_shape())?;
                in_pool(|| pool::avg_pool2d_backward(g, &go, &mut gi))?;
                Ok(wrap(gi))
            }
            Pool2d::AdaptiveAvg(g) => {
                let mut gi = zeros::<T>(&g.shape.input_shape())?;
                in_pool(|| pool::adaptive_avg_pool2d_backward(g, &go, &mut gi))?;
                Ok(wrap(gi))
            }
        }
    })
}

/// Output slots of a norm backward, as `NormGrads`.
fn norm_grads<'a, T: Copy>(mask: GradMask, slots: &'a mut [HostBuffer<T>; 3]) -> NormGrads<'a, T> {
    let [gi, gw, gb] = slots;
    NormGrads {
        input: mask[0].then_some(gi.as_mut_slice()),
        weight: mask[1].then_some(gw.as_mut_slice()),
        bias: mask[2].then_some(gb.as_mut_slice()),
    }
}

fn wrap_grads<T: HostElement>(mask: GradMask, slots: [HostBuffer<T>; 3]) -> Grads3<CpuStorage> {
    let mut i = 0;
    slots.map(|v| {
        i += 1;
        mask[i - 1].then(|| wrap(v))
    })
}

fn layer_norm_shape(shape: &[usize], normalized_dims: usize) -> Result<LayerNormShape> {
    let k = normalized_dims.min(shape.len());
    Ok(LayerNormShape::new(shape, &shape[shape.len() - k..])?)
}

pub(super) fn layer_norm(
    x: Strided<'_, CpuStorage>,
    normalized_dims: usize,
    weight: Option<Strided<'_, CpuStorage>>,
    bias: Option<Strided<'_, CpuStorage>>,
    eps: f64,
) -> Result<[CpuStorage; 3]> {
    const OP: &str = "layer_norm";
    let shape = layer_norm_shape(x.1.shape(), normalized_dims)?;
    float_kernel!(OP, x.0.dtype(), T => {
        let input = dense::<T>(OP, x)?;
        let (w, b) = (dense_opt::<T>(OP, weight)?, dense_opt::<T>(OP, bias)?);
        let mut out = zeros::<T>(&[shape.rows, shape.cols])?;
        let (mut mean, mut rstd) = (zeros::<T>(&[shape.rows])?, zeros::<T>(&[shape.rows])?);
        let affine = Affine { weight: w.as_deref(), bias: b.as_deref() };
        let saved = SavedStatsMut { mean: &mut mean, rstd: &mut rstd };
        in_pool(|| norm::layer_norm_forward(&shape, &input, affine, eps, &mut out, saved))?;
        Ok([wrap(out), wrap(mean), wrap(rstd)])
    })
}

pub(super) fn layer_norm_backward(
    grad: Strided<'_, CpuStorage>,
    x: Strided<'_, CpuStorage>,
    normalized_dims: usize,
    weight: Option<Strided<'_, CpuStorage>>,
    saved: [Strided<'_, CpuStorage>; 2],
    mask: GradMask,
) -> Result<Grads3<CpuStorage>> {
    const OP: &str = "layer_norm_backward";
    let shape = layer_norm_shape(x.1.shape(), normalized_dims)?;
    float_kernel!(OP, grad.0.dtype(), T => {
        let (go, input, w) = (dense::<T>(OP, grad)?, dense::<T>(OP, x)?, dense_opt::<T>(OP, weight)?);
        let (mean, rstd) = (dense::<T>(OP, saved[0])?, dense::<T>(OP, saved[1])?);
        let mut slots = [
            zeros::<T>(&[if mask[0] { shape.rows * shape.cols } else { 0 }])?,
            zeros::<T>(&[if mask[1] { shape.cols } else { 0 }])?,
            zeros::<T>(&[if mask[2] { shape.cols } else { 0 }])?,
        ];
        let grads = norm_grads(mask, &mut slots);
        let saved = SavedStats { mean: &mean, rstd: &rstd };
        in_pool(|| norm::layer_norm_backward(&shape, &go, &input, w.as_deref(), saved, grads))?;
        Ok(wrap_grads(mask, slots))
    })
}

mod batch_norm;
mod index;
pub(super) use batch_norm::{batch_norm_backward, batch_norm_eval, batch_norm_train};
pub(super) use index::{
    embedding, embedding_backward, gather, index_select, index_select_backward, scatter,
};
