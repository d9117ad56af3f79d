//! Fill and strided copy: the two data-movement kernels every tensor needs (`torch.full` /
//! `Tensor.fill_`, and `Tensor.contiguous()` of a view).
//!
//! Both sides implement the same contract on flat buffers:
//! - `fill(dst, value)` writes `value` into every element of `dst`;
//! - `copy_strided(src, layout, dst)` gathers the view `layout` of `src` (shape, element strides,
//!   element offset, as in PyTorch's `as_strided`) into the contiguous row-major `dst`.
//!
//! [`StridedLayout::check`] validates a layout against the buffers once, for both sides, so a bad
//! view is a typed error before any kernel runs, never an out-of-bounds read. Strides are
//! non-negative (PyTorch rejects negative strides too); zero strides (broadcast views) are fine.
//! [`cpu`] runs on slices; [`cuda`] launches the kernels of `fill.cu` on a cudarc stream, for
//! f32, f64, f16, bf16, i32, i64 and u8 (copy works on any element of 1, 2, 4 or 8 bytes).

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

use crate::error::{Error, Result};
use crate::ops::buffer::BufferOps;
use crate::seam::seam_trait;
use crate::DType;

seam_trait! {
    /// Buffers made from a value: constants and ranges.
    pub trait FillOps: BufferOps {
        /// `n` elements equal to `value` (converted to `dtype`).
        fn full(device: Device, n: usize, value: f64, dtype: DType) -> Result<Self>;
        /// `start, start + step, ...` (`n` elements).
        fn arange(device: Device, start: f64, step: f64, n: usize, dtype: DType) -> Result<Self>;
    }
}

/// Most dimensions a strided copy handles (the CUDA kernel takes the layout by value).
pub const MAX_DIMS: usize = 8;

/// A strided view of a flat buffer: element `idx` (a multi-index into `shape`) lives at
/// `offset + Σ idx[d] * strides[d]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StridedLayout {
    /// Size of each dimension.
    pub shape: Vec<usize>,
    /// Step in elements along each dimension.
    pub strides: Vec<usize>,
    /// Element index of the view's first element.
    pub offset: usize,
}

impl StridedLayout {
    /// A contiguous row-major layout of `shape`.
    pub fn contiguous(shape: &[usize]) -> Self {
        let mut strides = vec![1; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * shape[d + 1].max(1);
        }
        Self {
            shape: shape.to_vec(),
            strides,
            offset: 0,
        }
    }

    /// Number of elements in the view.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Checks the layout against a source of `src_len` and a destination of `dst_len` elements;
    /// returns the number of elements to copy.
    pub fn check(&self, op: &'static str, src_len: usize, dst_len: usize) -> Result<usize> {
        let mismatch = |what: String| Error::LengthMismatch { op, what };
        if self.shape.len() != self.strides.len() {
            return Err(mismatch(format!(
                "shape has {} dims but strides have {}",
                self.shape.len(),
                self.strides.len()
            )));
        }
        if self.shape.len() > MAX_DIMS {
            return Err(mismatch(format!(
                "{} dims exceed the maximum of {MAX_DIMS}",
                self.shape.len()
            )));
        }
        let numel = self.numel();
        if numel != dst_len {
            return Err(mismatch(format!(
                "view has {numel} elements but dst has {dst_len}"
            )));
        }
        if numel == 0 {
            return Ok(0);
        }
        let last = self
            .shape
            .iter()
            .zip(&self.strides)
            .try_fold(self.offset, |acc, (&n, &s)| {
                acc.checked_add((n - 1).checked_mul(s)?)
            });
        match last {
            Some(last) if last < src_len => Ok(numel),
            _ => Err(mismatch(format!(
                "view (shape {:?}, strides {:?}, offset {}) reaches past src of {src_len} elements",
                self.shape, self.strides, self.offset
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_strides_are_row_major() {
        assert_eq!(
            StridedLayout::contiguous(&[2, 3, 4]).strides,
            vec![12, 4, 1]
        );
        assert_eq!(StridedLayout::contiguous(&[]).numel(), 1);
    }

    #[test]
    fn layouts_are_checked_against_both_buffers() {
        let transposed = StridedLayout {
            shape: vec![3, 2],
            strides: vec![1, 3],
            offset: 0,
        };
        assert_eq!(transposed.check("t", 6, 6).unwrap(), 6);
        let errs = [
            transposed.check("t", 5, 6).unwrap_err(),
            transposed.check("t", 6, 5).unwrap_err(),
            StridedLayout {
                shape: vec![2],
                strides: vec![],
                offset: 0,
            }
            .check("t", 9, 2)
            .unwrap_err(),
            StridedLayout {
                shape: vec![1; 9],
                strides: vec![1; 9],
                offset: 0,
            }
            .check("t", 9, 1)
            .unwrap_err(),
            StridedLayout {
                shape: vec![2],
                strides: vec![usize::MAX],
                offset: 1,
            }
            .check("t", 9, 2)
            .unwrap_err(),
        ];
        let texts: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        assert!(texts[0].contains("reaches past src of 5"), "{}", texts[0]);
        assert!(
            texts[1].contains("view has 6 elements but dst has 5"),
            "{}",
            texts[1]
        );
        assert!(
            texts[2].contains("shape has 1 dims but strides have 0"),
            "{}",
            texts[2]
        );
        assert!(texts[3].contains("exceed the maximum of 8"), "{}", texts[3]);
        assert!(texts[4].contains("reaches past"), "{}", texts[4]);
        let empty = StridedLayout {
            shape: vec![0, 5],
            strides: vec![100, 100],
            offset: 7,
        };
        assert_eq!(empty.check("t", 0, 0).unwrap(), 0);
    }
}
