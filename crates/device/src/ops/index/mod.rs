//! Indexing ops: `embedding`, `index_select`, `gather`, `scatter`, `scatter_add`, forward and
//! backward.
//!
//! Indices are `i64` (PyTorch's `long`), tensors contiguous with explicit shapes. Every kernel
//! validates all index values *before* writing anything; the first bad one (row-major order)
//! comes back as [`KernelError::IndexOutOfRange`] with its value and coordinates, the
//! dimension it indexes and that dimension's size. Negative indices are errors, as in PyTorch's
//! `gather`/`index_select`/`embedding` (wrap-around is the caller's decision).
//!
//! On CUDA the index values are checked on the device without waiting for the stream, so the
//! error arrives at the next synchronisation (`to_vec`, `item`, a copy to the host,
//! [`crate::synchronize`]) as [`crate::Error::DeferredCheck`] wrapping this same
//! `IndexOutOfRange`; `KILN_CUDA_EAGER_CHECKS=1` or [`crate::set_eager_checks`]`(true)` returns
//! it at the op, as here. The CUDA kernels skip a bad index (a take writes 0, a put leaves the
//! element out), so nothing out of bounds is touched ([`cuda`] and `crate::cuda::deferred`).
//!
//! Backward rules, in terms of these kernels:
//! - `embedding`: [`cpu::embedding_backward`] (rows of `padding_idx` get no gradient).
//! - `index_select`: [`cpu::index_select_backward`] (an index-add into zeros).
//! - `gather`: [`cpu::gather_backward`] = `scatter_add` of the output gradient into zeros.
//! - `scatter_add`: self gets the output gradient unchanged; src gets `gather(grad, dim, index)`.
//! - `scatter`: self gets the output gradient with the scattered positions zeroed
//!   ([`cpu::scatter_value_`] with 0); src gets `gather(grad, dim, index)`.
//!
//! Shape rules are PyTorch's: `gather`'s index has the input's number of dims and is no
//! larger than the input in every dim but `dim`; `scatter`'s index is no larger than `src` in
//! every dim and no larger than `self` in every dim but `dim`.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

use super::kernel_error::KernelError;
use crate::ops::buffer::BufferOps;
use crate::seam::{seam_trait, Strided};
use crate::Layout;

seam_trait! {
    /// Indexing (indices are `I64`; each kernel checks every index value).
    pub trait IndexOps: BufferOps {
        /// `embedding`: rows of the table `self` `[num, dim]` picked by `indices` (any shape);
        /// output `[..indices.shape, dim]`.
        fn embedding(&self, layout: &Layout, indices: Strided<'_, Self>) -> crate::Result<Self>;
        /// Gradient of the table from `self` = the output gradient, summed per index, none for
        /// `padding_idx` (already in `[0, num_embeddings)`).
        fn embedding_backward(
            &self,
            layout: &Layout,
            indices: Strided<'_, Self>,
            num_embeddings: usize,
            padding_idx: Option<i64>,
        ) -> crate::Result<Self>;
        /// `index_select(self, dim, index)` with a 1-D `index`.
        fn index_select(&self, layout: &Layout, dim: usize, index: Strided<'_, Self>)
            -> crate::Result<Self>;
        /// Gradient of `index_select` from `self` = the output gradient: an index-add into
        /// zeros of `input_shape`.
        fn index_select_backward(
            &self,
            layout: &Layout,
            input_shape: &[usize],
            dim: usize,
            index: Strided<'_, Self>,
        ) -> crate::Result<Self>;
        /// `gather(self, dim, index)`: the output has the index's shape.
        fn gather(&self, layout: &Layout, dim: usize, index: Strided<'_, Self>)
            -> crate::Result<Self>;
        /// Out-of-place `scatter` (`accumulate = false`, last write wins) or `scatter_add`: a
        /// copy of `self` with `src` written (added) at `index` along `dim`.
        op(if accumulate { "scatter_add" } else { "scatter" })
        fn scatter(
            &self,
            layout: &Layout,
            dim: usize,
            index: Strided<'_, Self>,
            src: Strided<'_, Self>,
            accumulate: bool,
        ) -> crate::Result<Self>;
    }
}

/// Sizes of an embedding table `[num_embeddings, embedding_dim]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbeddingShape {
    /// Rows of the table (the valid index range is `0..num_embeddings`).
    pub num_embeddings: usize,
    /// Width of each row.
    pub embedding_dim: usize,
}

/// Options of the embedding backward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EmbeddingBackwardOptions {
    /// Row that receives no gradient; negative values count from the end, as in PyTorch.
    pub padding_idx: Option<i64>,
    /// Divide each row's gradient by how often its index occurs in the batch.
    pub scale_grad_by_freq: bool,
}

/// An index tensor used along one dimension: what `gather` and the `scatter` family take.
#[derive(Debug, Clone, Copy)]
pub struct DimIndex<'a> {
    /// The dimension the index values select along.
    pub dim: usize,
    /// The index values, contiguous.
    pub index: &'a [i64],
    /// The index tensor's shape.
    pub shape: &'a [usize],
}

/// Row-major (contiguous) strides of `shape`.
fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}

/// Coordinates of the element at row-major offset `flat` in `shape`.
fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut coords = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        let size = shape[d].max(1);
        coords[d] = flat % size;
        flat /= size;
    }
    coords
}

/// Errors unless `dim < ndim`.
fn check_dim(op: &'static str, dim: usize, ndim: usize) -> Result<(), KernelError> {
    if dim < ndim {
        Ok(())
    } else {
        Err(KernelError::DimOutOfRange { op, dim, ndim })
    }
}

/// Errors on the first index (row-major) outside `0..size`.
fn check_index_values(
    op: &'static str,
    index: &[i64],
    index_shape: &[usize],
    dim: usize,
    size: usize,
) -> Result<(), KernelError> {
    match index.iter().position(|&i| i < 0 || i as u64 >= size as u64) {
        None => Ok(()),
        Some(flat) => Err(KernelError::IndexOutOfRange {
            op,
            index: index[flat],
            position: unravel(flat, index_shape),
            dim,
            size,
        }),
    }
}

/// Checks the index tensor's rank against `shape` and that it is no larger than `shape` in
/// every dim (every dim but `except`, when given).
fn check_index_fits(
    op: &'static str,
    index: &DimIndex<'_>,
    other_name: &str,
    other_shape: &[usize],
    except: Option<usize>,
) -> Result<(), KernelError> {
    if index.shape.len() != other_shape.len() {
        return Err(KernelError::InvalidShape {
            op,
            shape: index.shape.to_vec(),
            rule: format!(
                "the index needs as many dims as {other_name} {other_shape:?}; reshape or \
                 unsqueeze the index"
            ),
        });
    }
    for (d, (&i, &o)) in index.shape.iter().zip(other_shape).enumerate() {
        if Some(d) != except && i > o {
            let scope = if except.is_some() {
                format!("in every dim but {}", index.dim)
            } else {
                "in every dim".to_string()
            };
            return Err(KernelError::InvalidShape {
                op,
                shape: index.shape.to_vec(),
                rule: format!(
                    "the index may be no larger than {other_name} {other_shape:?} {scope}, but \
                     dim {d} has size {i} > {o}; narrow the index"
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{contiguous_strides, unravel};

    #[test]
    fn strides_and_coordinates() {
        assert_eq!(contiguous_strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(contiguous_strides(&[]), Vec::<usize>::new());
        assert_eq!(unravel(17, &[2, 3, 4]), vec![1, 1, 1]);
        assert_eq!(unravel(23, &[2, 3, 4]), vec![1, 2, 3]);
    }
}
