//! Typed access to the buffers behind tensors, for the fused multi-tensor passes.
//!
//! A tensor whose elements form one dense range of its buffer (contiguous, any offset) is
//! handed to kernels as a slice of that range. Callers route anything else (strided views,
//! tensors sharing a buffer with another in the same list, CUDA tensors) to a per-tensor path.

use crate::{Error, Result};
use kiln_autograd::Tensor;
use kiln_device::ops::multi_tensor::{FloatSlice, FloatSliceMut};
use kiln_device::{CpuStorage, DType, Storage};
use std::collections::HashSet;
use std::ops::{Add, Div, Mul, Neg, Sub};

/// True when `t` is a dense range of a host buffer (the fused CPU path can take it as a slice).
pub(crate) fn is_dense_host(t: &Tensor) -> bool {
    t.is_contiguous() && t.device().is_cpu()
}

/// Marks the tensors of `list` whose buffers no other tensor in the list uses.
pub(crate) fn unshared(list: &[Tensor]) -> Vec<bool> {
    let mut seen = HashSet::new();
    let mut dup = HashSet::new();
    for t in list {
        if !seen.insert(t.storage_key()) {
            dup.insert(t.storage_key());
        }
    }
    list.iter()
        .map(|t| !dup.contains(&t.storage_key()))
        .collect()
}

fn range(t: &Tensor) -> std::ops::Range<usize> {
    let off = t.layout().offset();
    off..off + t.numel()
}

fn not_host(op: &'static str, t: &Tensor) -> Error {
    Error::Unsupported {
        op,
        msg: format!(
            "a {} tensor on {} has no fused path here; move it to the CPU or use a float dtype",
            t.dtype(),
            t.device()
        ),
    }
}

/// The elements of a dense host float tensor, read-only.
pub(crate) fn float_slice<'a>(
    op: &'static str,
    st: &'a Storage,
    t: &Tensor,
) -> Result<FloatSlice<'a>> {
    let r = range(t);
    Ok(match st {
        Storage::Cpu(CpuStorage::F32(b)) => FloatSlice::F32(&b.as_slice()[r]),
        Storage::Cpu(CpuStorage::F64(b)) => FloatSlice::F64(&b.as_slice()[r]),
        Storage::Cpu(CpuStorage::F16(b)) => FloatSlice::F16(&b.as_slice()[r]),
        Storage::Cpu(CpuStorage::BF16(b)) => FloatSlice::BF16(&b.as_slice()[r]),
        _ => return Err(not_host(op, t)),
    })
}

/// The elements of a dense host float tensor, writable.
pub(crate) fn float_slice_mut<'a>(
    op: &'static str,
    st: &'a mut Storage,
    t: &Tensor,
) -> Result<FloatSliceMut<'a>> {
    let r = range(t);
    Ok(match st {
        Storage::Cpu(CpuStorage::F32(b)) => FloatSliceMut::F32(&mut b.as_mut_slice()[r]),
        Storage::Cpu(CpuStorage::F64(b)) => FloatSliceMut::F64(&mut b.as_mut_slice()[r]),
        Storage::Cpu(CpuStorage::F16(b)) => FloatSliceMut::F16(&mut b.as_mut_slice()[r]),
        Storage::Cpu(CpuStorage::BF16(b)) => FloatSliceMut::BF16(&mut b.as_mut_slice()[r]),
        _ => return Err(not_host(op, t)),
    })
}

/// A float type optimizer updates compute in (`f32`, `f64`).
pub(crate) trait OptFloat:
    Copy
    + Send
    + Sync
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + 'static
{
    /// The dtype.
    const DTYPE: DType;
    /// `v` rounded to this type.
    fn of(v: f64) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// True for NaN.
    fn is_nan(self) -> bool;
    /// The tensor's elements in `st`, if it holds this type.
    fn slice<'a>(st: &'a Storage, t: &Tensor) -> Option<&'a [Self]>;
    /// The tensor's elements in `st`, writable, if it holds this type.
    fn slice_mut<'a>(st: &'a mut Storage, t: &Tensor) -> Option<&'a mut [Self]>;
}

macro_rules! opt_float {
    ($t:ty, $variant:ident, $dtype:ident) => {
        impl OptFloat for $t {
            const DTYPE: DType = DType::$dtype;
            #[inline(always)]
            fn of(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            fn slice<'a>(st: &'a Storage, t: &Tensor) -> Option<&'a [Self]> {
                match st {
                    Storage::Cpu(CpuStorage::$variant(b)) => Some(&b.as_slice()[range(t)]),
                    _ => None,
                }
            }
            fn slice_mut<'a>(st: &'a mut Storage, t: &Tensor) -> Option<&'a mut [Self]> {
                match st {
                    Storage::Cpu(CpuStorage::$variant(b)) => Some(&mut b.as_mut_slice()[range(t)]),
                    _ => None,
                }
            }
        }
    };
}
opt_float!(f32, F32, F32);
opt_float!(f64, F64, F64);

/// Runs `f` once over read-only slices of every tensor (one fused pass). Tensors that are not a
/// dense range of a host buffer are first copied into one.
pub(crate) fn with_slices<R: Send>(
    op: &'static str,
    tensors: &[Tensor],
    f: impl FnOnce(&[FloatSlice<'_>]) -> R + Send,
) -> Result<R> {
    let work: Vec<Tensor> = tensors
        .iter()
        .map(|t| {
            if t.device().is_cpu() && !t.is_contiguous() {
                kiln_autograd::no_grad(|| t.contiguous())
            } else {
                Ok(t.clone())
            }
        })
        .collect::<Result<_, _>>()?;
    let guards: Vec<_> = work.iter().map(|t| t.storage_read()).collect();
    let slices = guards
        .iter()
        .zip(&work)
        .map(|(g, t)| float_slice(op, g, t))
        .collect::<Result<Vec<_>>>()?;
    Ok(kiln_device::threads::cpu_pool().install(|| f(&slices)))
}

/// Runs `f` once over writable slices of every tensor (one fused pass). Strided views and
/// tensors sharing a buffer with another in the list go through a dense copy that is written
/// back afterwards, so every tensor is updated exactly as if it were dense.
pub(crate) fn with_slices_mut<R: Send>(
    op: &'static str,
    tensors: &[Tensor],
    f: impl FnOnce(Vec<FloatSliceMut<'_>>) -> R + Send,
) -> Result<R> {
    let alone = unshared(tensors);
    let mut copies: Vec<(usize, Tensor)> = Vec::new();
    let mut work: Vec<Tensor> = Vec::with_capacity(tensors.len());
    for (i, t) in tensors.iter().enumerate() {
        if !t.device().is_cpu() {
            return Err(not_host(op, t));
        }
        if is_dense_host(t) && alone[i] {
            work.push(t.clone());
        } else {
            let c = kiln_autograd::no_grad(|| t.copy_data())?;
            copies.push((i, c.clone()));
            work.push(c);
        }
    }
    let result = kiln_autograd::no_grad(|| -> Result<R> {
        let mut guards = work
            .iter()
            .map(|t| t.storage_write())
            .collect::<Result<Vec<_>, _>>()?;
        let slices = guards
            .iter_mut()
            .zip(&work)
            .map(|(g, t)| float_slice_mut(op, g, t))
            .collect::<Result<Vec<_>>>()?;
        Ok(kiln_device::threads::cpu_pool().install(|| f(slices)))
    })?;
    kiln_autograd::no_grad(|| -> Result<()> {
        for (i, c) in copies {
            tensors[i].copy_(&c)?;
        }
        Ok(())
    })?;
    Ok(result)
}
