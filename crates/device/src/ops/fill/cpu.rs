//! Fill and strided copy on host slices (the reference the CUDA kernels are tested against).

use super::FillOps;
use super::StridedLayout;
use crate::dtype::{BoolByte, DType, Element};
use crate::error::Result;
use crate::ops::cpu_dispatch::output;
use crate::storage::{by_dtype, HostBuffer};
use crate::{CpuStorage, Device};
use half::{bf16, f16};

/// Writes `value` into every element of `dst`.
pub fn fill<T: Copy>(dst: &mut [T], value: T) {
    dst.fill(value);
}

/// Gathers the view `layout` of `src` into the contiguous `dst` (row-major order).
pub fn copy_strided<T: Copy>(src: &[T], layout: &StridedLayout, dst: &mut [T]) -> Result<()> {
    let numel = layout.check("copy_strided", src.len(), dst.len())?;
    if numel == 0 {
        return Ok(());
    }
    let ndim = layout.shape.len();
    if ndim == 0 {
        dst[0] = src[layout.offset];
        return Ok(());
    }
    // Walk the outer dimensions like an odometer; copy the innermost one in a tight loop.
    let (inner_len, inner_stride) = (layout.shape[ndim - 1], layout.strides[ndim - 1]);
    let mut index = vec![0usize; ndim - 1];
    let mut base = layout.offset;
    for row in dst.chunks_exact_mut(inner_len) {
        for (j, out) in row.iter_mut().enumerate() {
            *out = src[base + j * inner_stride];
        }
        for d in (0..ndim - 1).rev() {
            index[d] += 1;
            base += layout.strides[d];
            if index[d] < layout.shape[d] {
                break;
            }
            base -= index[d] * layout.strides[d];
            index[d] = 0;
        }
    }
    Ok(())
}

impl FillOps for CpuStorage {
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
        by_dtype!(dtype, E => output::<E>(n, |out| {
            for (i, o) in out.iter_mut().enumerate() {
                *o = E::from_f64(start + step * i as f64);
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    #[test]
    fn fill_writes_every_element() {
        let mut a = vec![0.0f32; 5];
        fill(&mut a, 1.5);
        assert_eq!(a, vec![1.5; 5]);
        let mut h = vec![f16::ZERO; 3];
        fill(&mut h, f16::from_f32(-2.0));
        assert_eq!(h, vec![f16::from_f32(-2.0); 3]);
        let mut b = vec![bf16::ZERO; 2];
        fill(&mut b, bf16::from_f32(0.5));
        assert_eq!(b[1].to_f32(), 0.5);
        let mut i = vec![0i64; 4];
        fill(&mut i, -7);
        assert_eq!(i, vec![-7; 4]);
        let mut u: Vec<u8> = vec![];
        fill(&mut u, 3);
        assert!(u.is_empty());
    }

    #[test]
    fn copy_of_a_transpose_matches_by_hand() {
        // src is the 2x3 matrix [[0,1,2],[3,4,5]]; its transpose is 3x2 with strides (1, 3).
        let src: Vec<i64> = (0..6).collect();
        let t = StridedLayout {
            shape: vec![3, 2],
            strides: vec![1, 3],
            offset: 0,
        };
        let mut dst = vec![0i64; 6];
        copy_strided(&src, &t, &mut dst).unwrap();
        assert_eq!(dst, vec![0, 3, 1, 4, 2, 5]);
    }

    #[test]
    fn copy_of_offset_slices_broadcasts_and_scalars() {
        // x = arange(24).view(2,3,4); x[:, 1:, ::2] has shape (2,2,2), strides (12,4,2), offset 4.
        let src: Vec<f64> = (0..24).map(f64::from).collect();
        let view = StridedLayout {
            shape: vec![2, 2, 2],
            strides: vec![12, 4, 2],
            offset: 4,
        };
        let mut dst = vec![0.0; 8];
        copy_strided(&src, &view, &mut dst).unwrap();
        assert_eq!(dst, vec![4.0, 6.0, 8.0, 10.0, 16.0, 18.0, 20.0, 22.0]);
        // A (3,) row broadcast to (2,3) via stride 0.
        let row = [1u8, 2, 3];
        let bcast = StridedLayout {
            shape: vec![2, 3],
            strides: vec![0, 1],
            offset: 0,
        };
        let mut out = [0u8; 6];
        copy_strided(&row, &bcast, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 1, 2, 3]);
        // A 0-dim view of element 5.
        let scalar = StridedLayout {
            shape: vec![],
            strides: vec![],
            offset: 5,
        };
        let mut one = [0.0f64];
        copy_strided(&src, &scalar, &mut one).unwrap();
        assert_eq!(one, [5.0]);
        // Contiguous layout is the identity.
        let mut same = vec![0.0; 24];
        copy_strided(&src, &StridedLayout::contiguous(&[2, 3, 4]), &mut same).unwrap();
        assert_eq!(same, src);
    }

    #[test]
    fn bad_views_are_errors_not_panics() {
        let src = [0f32; 4];
        let mut dst = [0f32; 4];
        let past = StridedLayout {
            shape: vec![2, 2],
            strides: vec![2, 1],
            offset: 1,
        };
        assert!(copy_strided(&src, &past, &mut dst).is_err());
        assert_eq!(dst, [0.0; 4]);
    }
}
