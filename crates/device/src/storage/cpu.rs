//! [`CpuStorage`]: a host buffer of one dtype, and its [`BackendStorage`] implementation, which
//! dispatches each op to the generic kernels in `crate::ops::<family>::cpu`.
//!
//! Float kernels are written for `f32`/`f64`; `F16`/`BF16` inputs are widened to `f32`, computed,
//! and rounded back once (what PyTorch's CPU kernels do for half types).
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
//!   the nn ops (`cpu_nn`), the widened `f32` operands and `f32` results of `F16`/`BF16` ops,
//!   conv2d's im2col columns (one per rayon task) and its per-thread partial weight gradients.
//!   So `max_memory_allocated` is the real peak of tensor-sized memory.
//! - not counted (system allocator): `gemm`'s internal packing buffers, and small per-op
//!   bookkeeping (layouts, per-batch offsets, index coordinates, per-column or per-class `f64`
//!   accumulators in norm and loss kernels, index-frequency counts), all far smaller than the
//!   tensors involved; the cross-entropy kernel's class-index targets converted to `i64` (a
//!   `Vec`); plus whatever the caller itself allocates.

use super::cpu_nn::{self, HostElement};
use super::host::HostBuffer;
use crate::backend::{
    BackendStorage, BatchNormStats, BinaryOp, CmpOp, GradMask, Grads3, Pool2d, ReduceOp,
    RunningStatsMut, Strided, UnaryOp,
};
use crate::dtype::{BoolByte, DType, Element};
use crate::layout::Layout;
use crate::ops::conv::Conv2dGeometry;
use crate::ops::{copy, elementwise, matmul, random, reduce, softmax};
use crate::{Device, Error, Result};
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
            CpuStorage::F32(b) => {
                let $s = b.as_slice();
                $body
            }
            CpuStorage::F64(b) => {
                let $s = b.as_slice();
                $body
            }
            CpuStorage::F16(b) => {
                let $s = b.as_slice();
                $body
            }
            CpuStorage::BF16(b) => {
                let $s = b.as_slice();
                $body
            }
            CpuStorage::I64(b) => {
                let $s = b.as_slice();
                $body
            }
            CpuStorage::U8(b) => {
                let $s = b.as_slice();
                $body
            }
            CpuStorage::Bool(b) => {
                let $s = b.as_slice();
                $body
            }
        }
    };
}

/// Runs `$body` with `$T` the element type of `$dtype`.
macro_rules! build {
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

/// A new storage of `len` elements of `T`, written in place by `write` (a kernel taking its
/// output slice): one block of the CPU allocator, zero-filled first, no intermediate `Vec`.
fn output<T: HostElement>(len: usize, write: impl FnOnce(&mut [T])) -> Result<CpuStorage> {
    Ok(T::wrap(HostBuffer::try_filled_with(len, T::zero(), write)?))
}

/// A new `f32` buffer of `len` elements written by `write` (the `f32` result of a half-precision
/// op before it is rounded back).
fn f32_buffer(len: usize, write: impl FnOnce(&mut [f32])) -> Result<HostBuffer<f32>> {
    HostBuffer::try_filled_with(len, 0.0, write)
}

/// `v` as `Vec<U>` when `T` and `U` are the same type.
fn retype<T: 'static, U: 'static>(v: Vec<T>) -> Option<Vec<U>> {
    if std::any::TypeId::of::<T>() != std::any::TypeId::of::<U>() {
        return None;
    }
    let mut v = std::mem::ManuallyDrop::new(v);
    // SAFETY: T and U are the same type (checked above), so layout and drop are identical.
    Some(unsafe { Vec::from_raw_parts(v.as_mut_ptr() as *mut U, v.len(), v.capacity()) })
}

fn unsupported(op: &'static str, dtype: DType, hint: &'static str) -> Error {
    Error::UnsupportedDType { op, dtype, hint }
}

const FLOAT_HINT: &str = "convert with to_dtype(DType::F32) first";

impl CpuStorage {
    /// A storage owning `data`.
    pub fn from_vec<T: Element>(data: Vec<T>) -> Self {
        build!(T::DTYPE, E => E::wrap(HostBuffer::from_vec(
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
        build!(dtype, E => {
            let n = bytes.len() / std::mem::size_of::<E>();
            let mut buf = HostBuffer::scratch(n, E::zero());
            // SAFETY: `buf` has room for exactly `n * size_of::<E>()` bytes, all patterns valid
            // for the float/int types; Bool bytes come from a Bool buffer.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.as_mut_slice().as_mut_ptr() as *mut u8, n * std::mem::size_of::<E>()) };
            E::wrap(buf)
        })
    }

    /// The elements of `layout` widened to `f32`, contiguous, in a block of the CPU allocator
    /// (the operand copy of a half-precision op computed in `f32`).
    fn widen(&self, layout: &Layout) -> Result<HostBuffer<f32>> {
        with_slice!(self, s => f32_buffer(layout.numel(), |out| copy::cpu::cast_into(s, layout, out)))
    }

    /// A byte view of a Bool or U8 storage (for conditions and masks).
    fn as_condition(&self, op: &'static str) -> Result<&[u8]> {
        match self {
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

/// Runs a float op natively on f32/f64 and through f32 on f16/bf16. `$body` writes the
/// `layout.numel()` outputs into `$out`.
macro_rules! float_op {
    ($self:expr, $layout:expr, $op:expr, |$s:ident, $l:ident, $out:ident| $body:expr) => {
        match $self {
            CpuStorage::F32(b) => {
                let ($s, $l) = (b.as_slice(), $layout);
                output::<f32>($l.numel(), |$out| $body)
            }
            CpuStorage::F64(b) => {
                let ($s, $l) = (b.as_slice(), $layout);
                output::<f64>($l.numel(), |$out| $body)
            }
            CpuStorage::F16(_) | CpuStorage::BF16(_) => {
                let wide = $self.widen($layout)?;
                let cl = Layout::contiguous($layout.shape());
                let ($s, $l) = (wide.as_slice(), &cl);
                let r = f32_buffer($l.numel(), |$out| $body)?;
                drop(wide);
                round_to_half(&r, $self.dtype())
            }
            other => Err(unsupported($op, other.dtype(), FLOAT_HINT)),
        }
    };
}

fn same_dtype(op: &'static str, a: &CpuStorage, b: &CpuStorage) -> Result<()> {
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch {
            op,
            lhs: a.dtype(),
            rhs: b.dtype(),
        });
    }
    Ok(())
}

impl BackendStorage for CpuStorage {
    fn dtype(&self) -> DType {
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

    fn device(&self) -> Device {
        Device::Cpu
    }

    fn len(&self) -> usize {
        with_slice!(self, s => s.len())
    }

    fn full(_device: Device, n: usize, value: f64, dtype: DType) -> Result<Self> {
        // Filled in place in an allocator block (no intermediate `Vec`).
        Ok(match dtype {
            DType::F32 => CpuStorage::F32(HostBuffer::filled(n, f32::from_f64(value))?),
            DType::F64 => CpuStorage::F64(HostBuffer::filled(n, value)?),
            DType::F16 => CpuStorage::F16(HostBuffer::filled(n, f16::from_f64(value))?),
            DType::BF16 => CpuStorage::BF16(HostBuffer::filled(n, bf16::from_f64(value))?),
            DType::I64 => CpuStorage::I64(HostBuffer::filled(n, i64::from_f64(value))?),
            DType::U8 => CpuStorage::U8(HostBuffer::filled(n, u8::from_f64(value))?),
            DType::Bool => CpuStorage::Bool(HostBuffer::filled(n, BoolByte::from_f64(value))?),
        })
    }

    fn arange(_device: Device, start: f64, step: f64, n: usize, dtype: DType) -> Result<Self> {
        build!(dtype, E => output::<E>(n, |out| {
            for (i, o) in out.iter_mut().enumerate() {
                *o = E::from_f64(start + step * i as f64);
            }
        }))
    }

    fn rand_uniform(
        _d: Device,
        n: usize,
        low: f64,
        high: f64,
        seed: u64,
        offset: u64,
        dtype: DType,
    ) -> Result<Self> {
        build!(dtype, E => output::<E>(n, |out| random::cpu::uniform(out, low, high, seed, offset)))
    }

    fn rand_normal(
        _d: Device,
        n: usize,
        mean: f64,
        std: f64,
        seed: u64,
        offset: u64,
        dtype: DType,
    ) -> Result<Self> {
        build!(dtype, E => output::<E>(n, |out| random::cpu::normals(out, mean, std, seed, offset)))
    }

    fn from_cpu(_device: Device, cpu: &CpuStorage) -> Result<Self> {
        Ok(cpu.clone())
    }

    fn to_cpu(&self, layout: &Layout) -> Result<CpuStorage> {
        self.copy_contiguous(layout)
    }

    fn unary(&self, layout: &Layout, op: UnaryOp) -> Result<Self> {
        if let CpuStorage::I64(b) = self {
            let mut supported = false;
            let out = output::<i64>(layout.numel(), |out| {
                supported = elementwise::cpu::unary_int(b.as_slice(), layout, op, out).is_some();
            })?;
            return match supported {
                true => Ok(out),
                false => Err(unsupported(op.name(), DType::I64, FLOAT_HINT)),
            };
        }
        float_op!(self, layout, op.name(), |s, l, out| {
            elementwise::cpu::unary_float(s, l, op, out)
        })
    }

    fn binary(
        &self,
        layout: &Layout,
        rhs: &Self,
        rhs_layout: &Layout,
        op: BinaryOp,
    ) -> Result<Self> {
        use elementwise::cpu::{binary_float, binary_int};
        same_dtype(op.name(), self, rhs)?;
        let n = layout.numel();
        match (self, rhs) {
            (CpuStorage::I64(a), CpuStorage::I64(b)) => {
                let mut supported = false;
                let out = output::<i64>(n, |out| {
                    let (a, b) = (a.as_slice(), b.as_slice());
                    supported = binary_int(a, layout, b, rhs_layout, op, out).is_some();
                })?;
                match supported {
                    true => Ok(out),
                    false => Err(unsupported(op.name(), DType::I64, FLOAT_HINT)),
                }
            }
            (CpuStorage::F32(a), CpuStorage::F32(b)) => output(n, |out| {
                binary_float(a.as_slice(), layout, b.as_slice(), rhs_layout, op, out)
            }),
            (CpuStorage::F64(a), CpuStorage::F64(b)) => output(n, |out| {
                binary_float(a.as_slice(), layout, b.as_slice(), rhs_layout, op, out)
            }),
            (CpuStorage::F16(_), _) | (CpuStorage::BF16(_), _) => {
                let (wa, wb) = (self.widen(layout)?, rhs.widen(rhs_layout)?);
                let cl = Layout::contiguous(layout.shape());
                let r = f32_buffer(n, |out| {
                    binary_float(wa.as_slice(), &cl, wb.as_slice(), &cl, op, out)
                })?;
                drop((wa, wb));
                CpuStorage::F32(r).to_dtype(&cl, self.dtype())
            }
            (other, _) => Err(unsupported(
                op.name(),
                other.dtype(),
                "convert with to_dtype(DType::F32) or to_dtype(DType::I64) first",
            )),
        }
    }

    fn compare(&self, layout: &Layout, rhs: &Self, rhs_layout: &Layout, op: CmpOp) -> Result<Self> {
        same_dtype("comparison", self, rhs)?;
        let rhs_layout = (rhs, rhs_layout);
        with_slice!(self, a => output::<BoolByte>(layout.numel(), |out| {
            let (b, lb) = rhs_layout;
            let b = HostElement::slice(b).expect("dtypes checked equal above");
            elementwise::cpu::compare(a, layout, b, lb, op, out)
        }))
    }

    fn where_cond(
        &self,
        layout: &Layout,
        on_true: &Self,
        tl: &Layout,
        on_false: &Self,
        fl: &Layout,
    ) -> Result<Self> {
        same_dtype("where", on_true, on_false)?;
        let cond = (self.as_condition("where")?, layout);
        with_slice!(on_true, t => output(layout.numel(), |out| {
            let f = HostElement::slice(on_false).expect("dtypes checked equal above");
            elementwise::cpu::where_cond(cond, (t, tl), (f, fl), out)
        }))
    }

    fn reduce(&self, layout: &Layout, dims: &[usize], op: ReduceOp) -> Result<Self> {
        use reduce::cpu::{
            arg_extreme_into, extreme_into, reduced_len, sum_float_into, sum_int_into,
        };
        let n = reduced_len(layout, dims);
        match op {
            ReduceOp::Sum => match self {
                CpuStorage::F32(b) => output(n, |o| sum_float_into(b.as_slice(), layout, dims, o)),
                CpuStorage::F64(b) => output(n, |o| sum_float_into(b.as_slice(), layout, dims, o)),
                CpuStorage::F16(b) => output(n, |o| sum_float_into(b.as_slice(), layout, dims, o)),
                CpuStorage::BF16(b) => output(n, |o| sum_float_into(b.as_slice(), layout, dims, o)),
                other => {
                    with_slice!(other, s => output::<i64>(n, |o| sum_int_into(s, layout, dims, o)))
                }
            },
            ReduceOp::Max => {
                with_slice!(self, s => output(n, |o| extreme_into(s, layout, dims, true, o)))
            }
            ReduceOp::Min => {
                with_slice!(self, s => output(n, |o| extreme_into(s, layout, dims, false, o)))
            }
            ReduceOp::ArgMax => {
                with_slice!(self, s => output::<i64>(n, |o| arg_extreme_into(s, layout, dims, true, o)))
            }
            ReduceOp::ArgMin => {
                with_slice!(self, s => output::<i64>(n, |o| arg_extreme_into(s, layout, dims, false, o)))
            }
        }
    }

    fn matmul(&self, layout: &Layout, rhs: &Self, rhs_layout: &Layout) -> Result<Self> {
        use matmul::cpu::{matmul_into, output_len};
        same_dtype("matmul", self, rhs)?;
        let n = output_len(layout, rhs_layout);
        match (self, rhs) {
            (CpuStorage::F32(a), CpuStorage::F32(b)) => output(n, |out| {
                matmul_into(a.as_slice(), layout, b.as_slice(), rhs_layout, out)
            }),
            (CpuStorage::F64(a), CpuStorage::F64(b)) => output(n, |out| {
                matmul_into(a.as_slice(), layout, b.as_slice(), rhs_layout, out)
            }),
            (CpuStorage::F16(_), _) | (CpuStorage::BF16(_), _) => {
                let (wa, wb) = (self.widen(layout)?, rhs.widen(rhs_layout)?);
                let (ca, cb) = (
                    Layout::contiguous(layout.shape()),
                    Layout::contiguous(rhs_layout.shape()),
                );
                let r = f32_buffer(n, |out| {
                    matmul_into(wa.as_slice(), &ca, wb.as_slice(), &cb, out)
                })?;
                drop((wa, wb));
                CpuStorage::F32(r).to_dtype(&Layout::contiguous(&[n]), self.dtype())
            }
            (other, _) => Err(unsupported("matmul", other.dtype(), FLOAT_HINT)),
        }
    }

    fn softmax_last_dim(&self, layout: &Layout, log: bool) -> Result<Self> {
        float_op!(self, layout, "softmax", |s, l, out| {
            softmax::cpu::softmax_last_dim(s, l, log, out)
        })
    }

    fn copy_contiguous(&self, layout: &Layout) -> Result<Self> {
        with_slice!(self, s => output(layout.numel(), |out| {
            copy::cpu::copy_contiguous_into(s, layout, out)
        }))
    }

    fn copy_into(&self, layout: &Layout, dst: &mut Self, dst_layout: &Layout) -> Result<()> {
        same_dtype("copy", self, dst)?;
        with_slice!(self, s => {
            let d = HostElement::slice_mut(dst).expect("dtypes checked equal above");
            copy::cpu::copy_into(s, layout, d, dst_layout)
        });
        Ok(())
    }

    fn to_dtype(&self, layout: &Layout, dtype: DType) -> Result<Self> {
        with_slice!(self, s => build!(dtype, E => output::<E>(layout.numel(), |out| {
            copy::cpu::cast_into(s, layout, out)
        })))
    }

    fn conv2d(
        &self,
        layout: &Layout,
        weight: Strided<'_, Self>,
        bias: Option<Strided<'_, Self>>,
        geometry: &Conv2dGeometry,
    ) -> Result<Self> {
        cpu_nn::conv2d((self, layout), weight, bias, geometry)
    }
    fn conv2d_backward(
        &self,
        layout: &Layout,
        input: Strided<'_, Self>,
        weight: Strided<'_, Self>,
        geometry: &Conv2dGeometry,
        mask: GradMask,
    ) -> Result<Grads3<Self>> {
        cpu_nn::conv2d_backward((self, layout), input, weight, geometry, mask)
    }
    fn pool2d(&self, layout: &Layout, pool: &Pool2d) -> Result<(Self, Option<Self>)> {
        cpu_nn::pool2d((self, layout), pool)
    }
    fn pool2d_backward(
        &self,
        layout: &Layout,
        indices: Option<Strided<'_, Self>>,
        pool: &Pool2d,
    ) -> Result<Self> {
        cpu_nn::pool2d_backward((self, layout), indices, pool)
    }
    fn batch_norm_train(
        &self,
        layout: &Layout,
        weight: Option<Strided<'_, Self>>,
        bias: Option<Strided<'_, Self>>,
        running: Option<RunningStatsMut<'_, Self>>,
        eps: f64,
    ) -> Result<[Self; 3]> {
        cpu_nn::batch_norm_train((self, layout), weight, bias, running, eps)
    }
    fn batch_norm_eval(
        &self,
        layout: &Layout,
        weight: Option<Strided<'_, Self>>,
        bias: Option<Strided<'_, Self>>,
        running_mean: Strided<'_, Self>,
        running_var: Strided<'_, Self>,
        eps: f64,
    ) -> Result<Self> {
        cpu_nn::batch_norm_eval(
            (self, layout),
            weight,
            bias,
            [running_mean, running_var],
            eps,
        )
    }
    fn batch_norm_backward(
        &self,
        layout: &Layout,
        input: Strided<'_, Self>,
        weight: Option<Strided<'_, Self>>,
        stats: BatchNormStats<'_, Self>,
        mask: GradMask,
    ) -> Result<Grads3<Self>> {
        cpu_nn::batch_norm_backward((self, layout), input, weight, stats, mask)
    }
    fn layer_norm(
        &self,
        layout: &Layout,
        normalized_dims: usize,
        weight: Option<Strided<'_, Self>>,
        bias: Option<Strided<'_, Self>>,
        eps: f64,
    ) -> Result<[Self; 3]> {
        cpu_nn::layer_norm((self, layout), normalized_dims, weight, bias, eps)
    }
    fn layer_norm_backward(
        &self,
        layout: &Layout,
        input: Strided<'_, Self>,
        normalized_dims: usize,
        weight: Option<Strided<'_, Self>>,
        saved: [Strided<'_, Self>; 2],
        mask: GradMask,
    ) -> Result<Grads3<Self>> {
        cpu_nn::layer_norm_backward((self, layout), input, normalized_dims, weight, saved, mask)
    }
    fn embedding(&self, layout: &Layout, indices: Strided<'_, Self>) -> Result<Self> {
        cpu_nn::embedding((self, layout), indices)
    }
    fn embedding_backward(
        &self,
        layout: &Layout,
        indices: Strided<'_, Self>,
        num_embeddings: usize,
        padding_idx: Option<i64>,
    ) -> Result<Self> {
        cpu_nn::embedding_backward((self, layout), indices, num_embeddings, padding_idx)
    }
    fn index_select(&self, layout: &Layout, dim: usize, index: Strided<'_, Self>) -> Result<Self> {
        cpu_nn::index_select((self, layout), dim, index)
    }
    fn index_select_backward(
        &self,
        layout: &Layout,
        input_shape: &[usize],
        dim: usize,
        index: Strided<'_, Self>,
    ) -> Result<Self> {
        cpu_nn::index_select_backward((self, layout), input_shape, dim, index)
    }
    fn gather(&self, layout: &Layout, dim: usize, index: Strided<'_, Self>) -> Result<Self> {
        cpu_nn::gather((self, layout), dim, index)
    }
    fn scatter(
        &self,
        layout: &Layout,
        dim: usize,
        index: Strided<'_, Self>,
        src: Strided<'_, Self>,
        accumulate: bool,
    ) -> Result<Self> {
        cpu_nn::scatter((self, layout), dim, index, src, accumulate)
    }
    fn softmax_cross_entropy(
        &self,
        layout: &Layout,
        target: &Self,
        target_layout: &Layout,
        weight: Option<(&Self, &Layout)>,
        spec: &crate::ops::loss::CrossEntropySpec,
    ) -> Result<crate::ops::loss::CrossEntropyOutput<Self>> {
        crate::ops::loss::cpu::softmax_cross_entropy_storage(
            self,
            layout,
            target,
            target_layout,
            weight,
            spec,
        )
    }
}
