//! The CPU side of the seam's indexing methods (`embedding`, `index_select`, `gather`,
//! `scatter`), over the kernels in `crate::ops::index`. Copy-only kernels take every dtype;
//! the ones that add (`*_backward`, `scatter_add`) take `f32`/`f64`. Kernel errors about an
//! index report its position in the flattened index; this module re-expresses it in the index
//! tensor's own coordinates.

use super::{dense, in_pool, wrap, zeros};
use crate::backend::Strided;
use crate::dtype::{BoolByte, DType};
use crate::ops::index::{cpu as index, DimIndex, EmbeddingBackwardOptions, EmbeddingShape};
use crate::ops::KernelError;
use crate::storage::cpu::CpuStorage;
use crate::{BackendStorage, Error, Result};
use half::{bf16, f16};

/// Re-expresses a flat index position reported by a kernel in the index tensor's coordinates.
fn with_index_shape(e: KernelError, index_shape: &[usize]) -> KernelError {
    match e {
        KernelError::IndexOutOfRange {
            op,
            index,
            position,
            dim,
            size,
        } if position.len() == 1 && index_shape.len() != 1 => {
            let mut flat = position[0];
            let mut coords = vec![0; index_shape.len()];
            for d in (0..index_shape.len()).rev() {
                let n = index_shape[d].max(1);
                coords[d] = flat % n;
                flat /= n;
            }
            KernelError::IndexOutOfRange {
                op,
                index,
                position: coords,
                dim,
                size,
            }
        }
        other => other,
    }
}

pub(in crate::storage) fn embedding(
    table: Strided<'_, CpuStorage>,
    indices: Strided<'_, CpuStorage>,
) -> Result<CpuStorage> {
    const OP: &str = "embedding";
    let [num_embeddings, embedding_dim] = table.1.shape().try_into().map_err(|_| {
        Error::from(KernelError::InvalidShape {
            op: OP,
            shape: table.1.shape().to_vec(),
            rule: "the weight must be 2-D [num_embeddings, embedding_dim]".into(),
        })
    })?;
    let idx = dense::<i64>(OP, indices)?;
    let shape = EmbeddingShape {
        num_embeddings,
        embedding_dim,
    };
    any_kernel!(table.0.dtype(), T => {
        let w = dense::<T>(OP, table)?;
        let mut out = zeros::<T>(&[idx.len(), embedding_dim])?;
        in_pool(|| index::embedding_forward(&shape, &w, &idx, &mut out))
            .map_err(|e| with_index_shape(e, indices.1.shape()))?;
        Ok(wrap(out))
    })
}

pub(in crate::storage) fn embedding_backward(
    grad: Strided<'_, CpuStorage>,
    indices: Strided<'_, CpuStorage>,
    num_embeddings: usize,
    padding_idx: Option<i64>,
) -> Result<CpuStorage> {
    const OP: &str = "embedding_backward";
    let embedding_dim = grad.1.shape().last().copied().unwrap_or(1);
    let idx = dense::<i64>(OP, indices)?;
    let shape = EmbeddingShape {
        num_embeddings,
        embedding_dim,
    };
    let options = EmbeddingBackwardOptions {
        padding_idx,
        scale_grad_by_freq: false,
    };
    float_kernel!(OP, grad.0.dtype(), T => {
        let go = dense::<T>(OP, grad)?;
        let mut gw = zeros::<T>(&[num_embeddings, embedding_dim])?;
        index::embedding_backward(&shape, &go, &idx, options, &mut gw)
            .map_err(|e| with_index_shape(e, indices.1.shape()))?;
        Ok(wrap(gw))
    })
}

pub(in crate::storage) fn index_select(
    x: Strided<'_, CpuStorage>,
    dim: usize,
    index: Strided<'_, CpuStorage>,
) -> Result<CpuStorage> {
    const OP: &str = "index_select";
    let idx = dense::<i64>(OP, index)?;
    let mut out_shape = x.1.shape().to_vec();
    if dim < out_shape.len() {
        out_shape[dim] = idx.len();
    }
    any_kernel!(x.0.dtype(), T => {
        let input = dense::<T>(OP, x)?;
        let mut out = zeros::<T>(&out_shape)?;
        in_pool(|| index::index_select_forward(&input, x.1.shape(), dim, &idx, &mut out))?;
        Ok(wrap(out))
    })
}

pub(in crate::storage) fn index_select_backward(
    grad: Strided<'_, CpuStorage>,
    input_shape: &[usize],
    dim: usize,
    index: Strided<'_, CpuStorage>,
) -> Result<CpuStorage> {
    const OP: &str = "index_select_backward";
    let idx = dense::<i64>(OP, index)?;
    float_kernel!(OP, grad.0.dtype(), T => {
        let go = dense::<T>(OP, grad)?;
        let mut gi = zeros::<T>(input_shape)?;
        in_pool(|| index::index_select_backward(&go, input_shape, dim, &idx, &mut gi))?;
        Ok(wrap(gi))
    })
}

pub(in crate::storage) fn gather(
    x: Strided<'_, CpuStorage>,
    dim: usize,
    index: Strided<'_, CpuStorage>,
) -> Result<CpuStorage> {
    const OP: &str = "gather";
    let idx = dense::<i64>(OP, index)?;
    let index = DimIndex {
        dim,
        index: &idx,
        shape: index.1.shape(),
    };
    any_kernel!(x.0.dtype(), T => {
        let input = dense::<T>(OP, x)?;
        let mut out = zeros::<T>(index.shape)?;
        index::gather_forward(&input, x.1.shape(), index, &mut out)?;
        Ok(wrap(out))
    })
}

pub(in crate::storage) fn scatter(
    x: Strided<'_, CpuStorage>,
    dim: usize,
    index: Strided<'_, CpuStorage>,
    src: Strided<'_, CpuStorage>,
    accumulate: bool,
) -> Result<CpuStorage> {
    let op = if accumulate { "scatter_add" } else { "scatter" };
    let idx = dense::<i64>(op, index)?;
    let dim_index = DimIndex {
        dim,
        index: &idx,
        shape: index.1.shape(),
    };
    if accumulate {
        float_kernel!(op, x.0.dtype(), T => {
            let mut dest = dense::<T>(op, x)?.into_owned()?;
            let s = dense::<T>(op, src)?;
            index::scatter_add_(&mut dest, x.1.shape(), dim_index, &s, src.1.shape())?;
            Ok(wrap(dest))
        })
    } else {
        any_kernel!(x.0.dtype(), T => {
            let mut dest = dense::<T>(op, x)?.into_owned()?;
            let s = dense::<T>(op, src)?;
            index::scatter_(&mut dest, x.1.shape(), dim_index, &s, src.1.shape())?;
            Ok(wrap(dest))
        })
    }
}
