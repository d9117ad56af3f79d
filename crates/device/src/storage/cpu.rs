//! [`CpuStorage`]: a host buffer of one dtype, and its [`BackendStorage`] implementation, which
//! dispatches each op to the generic kernels in `crate::ops::<family>::cpu`.
//!
//! Float kernels are written for `f32`/`f64`; `F16`/`BF16` inputs are widened to `f32`, computed,
//! and rounded back once (what PyTorch's CPU kernels do for half types).

use super::cpu_nn;
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

/// Maps a generic `fn(&[T]) -> Vec<T>` over any variant, keeping the dtype.
macro_rules! map_same {
    ($st:expr, $s:ident => $body:expr) => {
        match $st {
            CpuStorage::F32(b) => {
                let $s = b.as_slice();
                CpuStorage::F32(HostBuffer::from_vec($body))
            }
            CpuStorage::F64(b) => {
                let $s = b.as_slice();
                CpuStorage::F64(HostBuffer::from_vec($body))
            }
            CpuStorage::F16(b) => {
                let $s = b.as_slice();
                CpuStorage::F16(HostBuffer::from_vec($body))
            }
            CpuStorage::BF16(b) => {
                let $s = b.as_slice();
                CpuStorage::BF16(HostBuffer::from_vec($body))
            }
            CpuStorage::I64(b) => {
                let $s = b.as_slice();
                CpuStorage::I64(HostBuffer::from_vec($body))
            }
            CpuStorage::U8(b) => {
                let $s = b.as_slice();
                CpuStorage::U8(HostBuffer::from_vec($body))
            }
            CpuStorage::Bool(b) => {
                let $s = b.as_slice();
                CpuStorage::Bool(HostBuffer::from_vec($body))
            }
        }
    };
}

/// Builds a storage of `dtype` from a generic `Vec<T>` expression (`$T` names the element type).
macro_rules! build {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $T = f32;
                CpuStorage::F32(HostBuffer::from_vec($body))
            }
            DType::F64 => {
                type $T = f64;
                CpuStorage::F64(HostBuffer::from_vec($body))
            }
            DType::F16 => {
                type $T = f16;
                CpuStorage::F16(HostBuffer::from_vec($body))
            }
            DType::BF16 => {
                type $T = bf16;
                CpuStorage::BF16(HostBuffer::from_vec($body))
            }
            DType::I64 => {
                type $T = i64;
                CpuStorage::I64(HostBuffer::from_vec($body))
            }
            DType::U8 => {
                type $T = u8;
                CpuStorage::U8(HostBuffer::from_vec($body))
            }
            DType::Bool => {
                type $T = BoolByte;
                CpuStorage::Bool(HostBuffer::from_vec($body))
            }
        }
    };
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
        build!(T::DTYPE, E => retype::<T, E>(data).expect("T::DTYPE names T's own variant"))
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
    /// A storage of `dtype` from raw bytes (length a multiple of the element size).
    pub fn from_bytes(bytes: &[u8], dtype: DType) -> Self {
        build!(dtype, E => {
            let n = bytes.len() / std::mem::size_of::<E>();
            let mut v = vec![E::zero(); n];
            // SAFETY: `v` has room for exactly `n * size_of::<E>()` bytes, all patterns valid for
            // the float/int types; Bool bytes come from a Bool buffer.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr() as *mut u8, n * std::mem::size_of::<E>()) };
            v
        })
    }

    fn as_f32_vec(&self, layout: &Layout) -> Vec<f32> {
        with_slice!(self, s => copy::cpu::cast::<_, f32>(s, layout))
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

/// Runs a float op natively on f32/f64 and through f32 on f16/bf16.
macro_rules! float_op {
    ($self:expr, $layout:expr, $op:expr, |$s:ident, $l:ident| $body:expr) => {
        match $self {
            CpuStorage::F32(b) => {
                let ($s, $l) = (b.as_slice(), $layout);
                Ok(CpuStorage::F32(HostBuffer::from_vec($body)))
            }
            CpuStorage::F64(b) => {
                let ($s, $l) = (b.as_slice(), $layout);
                Ok(CpuStorage::F64(HostBuffer::from_vec($body)))
            }
            CpuStorage::F16(_) => {
                let wide = $self.as_f32_vec($layout);
                let cl = Layout::contiguous($layout.shape());
                let ($s, $l) = (wide.as_slice(), &cl);
                let r: Vec<f32> = $body;
                Ok(CpuStorage::F16(HostBuffer::from_vec(
                    r.into_iter().map(f16::from_f32).collect(),
                )))
            }
            CpuStorage::BF16(_) => {
                let wide = $self.as_f32_vec($layout);
                let cl = Layout::contiguous($layout.shape());
                let ($s, $l) = (wide.as_slice(), &cl);
                let r: Vec<f32> = $body;
                Ok(CpuStorage::BF16(HostBuffer::from_vec(
                    r.into_iter().map(bf16::from_f32).collect(),
                )))
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
        Ok(build!(dtype, E => (0..n).map(|i| E::from_f64(start + step * i as f64)).collect()))
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
        Ok(build!(dtype, E => random::cpu::uniform::<E>(n, low, high, seed, offset)))
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
        Ok(build!(dtype, E => random::cpu::normals::<E>(n, mean, std, seed, offset)))
    }

    fn from_cpu(_device: Device, cpu: &CpuStorage) -> Result<Self> {
        Ok(cpu.clone())
    }

    fn to_cpu(&self, layout: &Layout) -> Result<CpuStorage> {
        self.copy_contiguous(layout)
    }

    fn unary(&self, layout: &Layout, op: UnaryOp) -> Result<Self> {
        if let CpuStorage::I64(b) = self {
            return elementwise::cpu::unary_int(b.as_slice(), layout, op)
                .map(|v| CpuStorage::I64(HostBuffer::from_vec(v)))
                .ok_or_else(|| unsupported(op.name(), DType::I64, FLOAT_HINT));
        }
        float_op!(self, layout, op.name(), |s, l| {
            elementwise::cpu::unary_float(s, l, op)
        })
    }

    fn binary(
        &self,
        layout: &Layout,
        rhs: &Self,
        rhs_layout: &Layout,
        op: BinaryOp,
    ) -> Result<Self> {
        same_dtype(op.name(), self, rhs)?;
        match (self, rhs) {
            (CpuStorage::I64(a), CpuStorage::I64(b)) => {
                elementwise::cpu::binary_int(a.as_slice(), layout, b.as_slice(), rhs_layout, op)
                    .map(|v| CpuStorage::I64(HostBuffer::from_vec(v)))
                    .ok_or_else(|| unsupported(op.name(), DType::I64, FLOAT_HINT))
            }
            (CpuStorage::F32(a), CpuStorage::F32(b)) => Ok(CpuStorage::F32(HostBuffer::from_vec(
                elementwise::cpu::binary_float(a.as_slice(), layout, b.as_slice(), rhs_layout, op),
            ))),
            (CpuStorage::F64(a), CpuStorage::F64(b)) => Ok(CpuStorage::F64(HostBuffer::from_vec(
                elementwise::cpu::binary_float(a.as_slice(), layout, b.as_slice(), rhs_layout, op),
            ))),
            (CpuStorage::F16(_), _) | (CpuStorage::BF16(_), _) => {
                let (wa, wb) = (self.as_f32_vec(layout), rhs.as_f32_vec(rhs_layout));
                let cl = Layout::contiguous(layout.shape());
                let r = elementwise::cpu::binary_float(&wa, &cl, &wb, &cl, op);
                Ok(CpuStorage::F32(HostBuffer::from_vec(r)).to_dtype(&cl, self.dtype())?)
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
        let out = match (self, rhs) {
            (CpuStorage::F32(a), CpuStorage::F32(b)) => {
                elementwise::cpu::compare(a.as_slice(), layout, b.as_slice(), rhs_layout, op)
            }
            (CpuStorage::F64(a), CpuStorage::F64(b)) => {
                elementwise::cpu::compare(a.as_slice(), layout, b.as_slice(), rhs_layout, op)
            }
            (CpuStorage::F16(a), CpuStorage::F16(b)) => {
                elementwise::cpu::compare(a.as_slice(), layout, b.as_slice(), rhs_layout, op)
            }
            (CpuStorage::BF16(a), CpuStorage::BF16(b)) => {
                elementwise::cpu::compare(a.as_slice(), layout, b.as_slice(), rhs_layout, op)
            }
            (CpuStorage::I64(a), CpuStorage::I64(b)) => {
                elementwise::cpu::compare(a.as_slice(), layout, b.as_slice(), rhs_layout, op)
            }
            (CpuStorage::U8(a), CpuStorage::U8(b)) => {
                elementwise::cpu::compare(a.as_slice(), layout, b.as_slice(), rhs_layout, op)
            }
            (CpuStorage::Bool(a), CpuStorage::Bool(b)) => {
                elementwise::cpu::compare(a.as_slice(), layout, b.as_slice(), rhs_layout, op)
            }
            _ => unreachable!("dtypes checked equal above"),
        };
        Ok(CpuStorage::Bool(HostBuffer::from_vec(out)))
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
        Ok(match (on_true, on_false) {
            (CpuStorage::F32(a), CpuStorage::F32(b)) => CpuStorage::F32(HostBuffer::from_vec(
                elementwise::cpu::where_cond(cond, (a.as_slice(), tl), (b.as_slice(), fl)),
            )),
            (CpuStorage::F64(a), CpuStorage::F64(b)) => CpuStorage::F64(HostBuffer::from_vec(
                elementwise::cpu::where_cond(cond, (a.as_slice(), tl), (b.as_slice(), fl)),
            )),
            (CpuStorage::F16(a), CpuStorage::F16(b)) => CpuStorage::F16(HostBuffer::from_vec(
                elementwise::cpu::where_cond(cond, (a.as_slice(), tl), (b.as_slice(), fl)),
            )),
            (CpuStorage::BF16(a), CpuStorage::BF16(b)) => CpuStorage::BF16(HostBuffer::from_vec(
                elementwise::cpu::where_cond(cond, (a.as_slice(), tl), (b.as_slice(), fl)),
            )),
            (CpuStorage::I64(a), CpuStorage::I64(b)) => CpuStorage::I64(HostBuffer::from_vec(
                elementwise::cpu::where_cond(cond, (a.as_slice(), tl), (b.as_slice(), fl)),
            )),
            (CpuStorage::U8(a), CpuStorage::U8(b)) => CpuStorage::U8(HostBuffer::from_vec(
                elementwise::cpu::where_cond(cond, (a.as_slice(), tl), (b.as_slice(), fl)),
            )),
            (CpuStorage::Bool(a), CpuStorage::Bool(b)) => CpuStorage::Bool(HostBuffer::from_vec(
                elementwise::cpu::where_cond(cond, (a.as_slice(), tl), (b.as_slice(), fl)),
            )),
            _ => unreachable!("dtypes checked equal above"),
        })
    }

    fn reduce(&self, layout: &Layout, dims: &[usize], op: ReduceOp) -> Result<Self> {
        use reduce::cpu::{arg_extreme, extreme, sum_float, sum_int};
        Ok(match op {
            ReduceOp::Sum => match self {
                CpuStorage::F32(b) => {
                    CpuStorage::F32(HostBuffer::from_vec(sum_float(b.as_slice(), layout, dims)))
                }
                CpuStorage::F64(b) => {
                    CpuStorage::F64(HostBuffer::from_vec(sum_float(b.as_slice(), layout, dims)))
                }
                CpuStorage::F16(b) => {
                    CpuStorage::F16(HostBuffer::from_vec(sum_float(b.as_slice(), layout, dims)))
                }
                CpuStorage::BF16(b) => {
                    CpuStorage::BF16(HostBuffer::from_vec(sum_float(b.as_slice(), layout, dims)))
                }
                other => CpuStorage::I64(HostBuffer::from_vec(
                    with_slice!(other, s => sum_int(s, layout, dims)),
                )),
            },
            ReduceOp::Max => map_same!(self, s => extreme(s, layout, dims, true)),
            ReduceOp::Min => map_same!(self, s => extreme(s, layout, dims, false)),
            ReduceOp::ArgMax => CpuStorage::I64(HostBuffer::from_vec(
                with_slice!(self, s => arg_extreme(s, layout, dims, true)),
            )),
            ReduceOp::ArgMin => CpuStorage::I64(HostBuffer::from_vec(
                with_slice!(self, s => arg_extreme(s, layout, dims, false)),
            )),
        })
    }

    fn matmul(&self, layout: &Layout, rhs: &Self, rhs_layout: &Layout) -> Result<Self> {
        same_dtype("matmul", self, rhs)?;
        match (self, rhs) {
            (CpuStorage::F32(a), CpuStorage::F32(b)) => Ok(CpuStorage::F32(HostBuffer::from_vec(
                matmul::cpu::matmul(a.as_slice(), layout, b.as_slice(), rhs_layout),
            ))),
            (CpuStorage::F64(a), CpuStorage::F64(b)) => Ok(CpuStorage::F64(HostBuffer::from_vec(
                matmul::cpu::matmul(a.as_slice(), layout, b.as_slice(), rhs_layout),
            ))),
            (CpuStorage::F16(_), _) | (CpuStorage::BF16(_), _) => {
                let (wa, wb) = (self.as_f32_vec(layout), rhs.as_f32_vec(rhs_layout));
                let (ca, cb) = (
                    Layout::contiguous(layout.shape()),
                    Layout::contiguous(rhs_layout.shape()),
                );
                let r = matmul::cpu::matmul(&wa, &ca, &wb, &cb);
                let out = CpuStorage::F32(HostBuffer::from_vec(r));
                let n = out.len();
                out.to_dtype(&Layout::contiguous(&[n]), self.dtype())
            }
            (other, _) => Err(unsupported("matmul", other.dtype(), FLOAT_HINT)),
        }
    }

    fn softmax_last_dim(&self, layout: &Layout, log: bool) -> Result<Self> {
        float_op!(self, layout, "softmax", |s, l| {
            softmax::cpu::softmax_last_dim(s, l, log)
        })
    }

    fn copy_contiguous(&self, layout: &Layout) -> Result<Self> {
        Ok(map_same!(self, s => copy::cpu::copy_contiguous(s, layout)))
    }

    fn copy_into(&self, layout: &Layout, dst: &mut Self, dst_layout: &Layout) -> Result<()> {
        same_dtype("copy", self, dst)?;
        match (self, dst) {
            (CpuStorage::F32(a), CpuStorage::F32(b)) => {
                copy::cpu::copy_into(a.as_slice(), layout, b.as_mut_slice(), dst_layout)
            }
            (CpuStorage::F64(a), CpuStorage::F64(b)) => {
                copy::cpu::copy_into(a.as_slice(), layout, b.as_mut_slice(), dst_layout)
            }
            (CpuStorage::F16(a), CpuStorage::F16(b)) => {
                copy::cpu::copy_into(a.as_slice(), layout, b.as_mut_slice(), dst_layout)
            }
            (CpuStorage::BF16(a), CpuStorage::BF16(b)) => {
                copy::cpu::copy_into(a.as_slice(), layout, b.as_mut_slice(), dst_layout)
            }
            (CpuStorage::I64(a), CpuStorage::I64(b)) => {
                copy::cpu::copy_into(a.as_slice(), layout, b.as_mut_slice(), dst_layout)
            }
            (CpuStorage::U8(a), CpuStorage::U8(b)) => {
                copy::cpu::copy_into(a.as_slice(), layout, b.as_mut_slice(), dst_layout)
            }
            (CpuStorage::Bool(a), CpuStorage::Bool(b)) => {
                copy::cpu::copy_into(a.as_slice(), layout, b.as_mut_slice(), dst_layout)
            }
            _ => unreachable!("dtypes checked equal above"),
        }
        Ok(())
    }

    fn to_dtype(&self, layout: &Layout, dtype: DType) -> Result<Self> {
        Ok(with_slice!(self, s => build!(dtype, E => copy::cpu::cast::<_, E>(s, layout))))
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
