//! CPU indexing kernels.
//!
//! `embedding` and `index_select` forward copy whole rows (`embedding_dim` or `inner` values)
//! and run one rayon task per output row block; their backward passes add rows into a zeroed
//! gradient, parallel over `index_select`'s outer blocks (disjoint) and sequential for
//! `embedding` (rows collide when indices repeat). `gather`/`scatter` walk the index tensor in
//! row-major order with an odometer that keeps the running offsets into the other tensors, so
//! no coordinates are recomputed per element; scatters are sequential, which makes
//! "last write wins" for repeated indices deterministic.
//!
//! Copy-only kernels are generic over any `Copy` element (so integer and boolean tensors can
//! use them); kernels that add are generic over [`KernelFloat`].

use super::IndexOps;
use crate::ops::cpu_dispatch::{dense, float_kernel, in_pool, wrap, zeros};
use crate::ops::par;
use crate::seam::Strided;
use crate::storage::by_dtype;
use crate::{CpuStorage, Error, Layout, Result};

use super::{
    check_dim, check_index_fits, check_index_values, contiguous_strides, DimIndex,
    EmbeddingBackwardOptions, EmbeddingShape,
};
use crate::ops::kernel_error::{check_len, KernelError};
use crate::ops::KernelFloat;

/// Visits the elements of a tensor of shape `shape` in row-major order, calling
/// `visit(flat, offsets)` where `offsets[k] = Σ_d coord[d] * strides[k][d]`.
fn walk<const K: usize>(
    shape: &[usize],
    strides: [&[usize]; K],
    mut visit: impl FnMut(usize, [usize; K]),
) {
    let total: usize = shape.iter().product();
    let mut coords = vec![0; shape.len()];
    let mut offsets = [0; K];
    for flat in 0..total {
        visit(flat, offsets);
        for d in (0..shape.len()).rev() {
            coords[d] += 1;
            for k in 0..K {
                offsets[k] += strides[k][d];
            }
            if coords[d] < shape[d] {
                break;
            }
            for k in 0..K {
                offsets[k] -= shape[d] * strides[k][d];
            }
            coords[d] = 0;
        }
    }
}

/// Contiguous strides of `shape` with the stride of `dim` set to 0 (the index supplies it).
fn strides_without(shape: &[usize], dim: usize) -> (Vec<usize>, usize) {
    let mut strides = contiguous_strides(shape);
    let dim_stride = std::mem::replace(&mut strides[dim], 0);
    (strides, dim_stride)
}

/// Embedding lookup: `output[p] = weight[indices[p]]`.
///
/// Shapes: `weight` `[num_embeddings, embedding_dim]`, `indices` any shape (flattened, `P`
/// values), `output` `[P, embedding_dim]`.
pub fn embedding_forward<T: Copy + Send + Sync>(
    shape: &EmbeddingShape,
    weight: &[T],
    indices: &[i64],
    output: &mut [T],
) -> Result<(), KernelError> {
    const OP: &str = "embedding";
    let dim = shape.embedding_dim;
    check_len(OP, "weight", weight, &[shape.num_embeddings, dim])?;
    check_len(OP, "output", output, &[indices.len(), dim])?;
    check_index_values(OP, indices, &[indices.len()], 0, shape.num_embeddings)?;
    if dim == 0 {
        return Ok(());
    }
    par::chunks_mut(output, dim, &|r, row| {
        row.copy_from_slice(&weight[indices[r] as usize * dim..][..dim])
    });
    Ok(())
}

/// Gradient of the embedding table: the sum of the output-gradient rows of each index, none for
/// `padding_idx`, optionally divided by the index's frequency in `indices`.
///
/// Shapes: `grad_output` `[P, embedding_dim]`, `indices` `P` values, `grad_weight`
/// `[num_embeddings, embedding_dim]` (overwritten).
pub fn embedding_backward<T: KernelFloat>(
    shape: &EmbeddingShape,
    grad_output: &[T],
    indices: &[i64],
    options: EmbeddingBackwardOptions,
    grad_weight: &mut [T],
) -> Result<(), KernelError> {
    const OP: &str = "embedding_backward";
    let (num, dim) = (shape.num_embeddings, shape.embedding_dim);
    check_len(OP, "grad_output", grad_output, &[indices.len(), dim])?;
    check_len(OP, "grad_weight", grad_weight, &[num, dim])?;
    check_index_values(OP, indices, &[indices.len()], 0, num)?;
    let padding = match options.padding_idx {
        None => None,
        Some(p) => {
            let normalised = if p < 0 { p + num as i64 } else { p };
            if !(0..num as i64).contains(&normalised) {
                return Err(KernelError::PaddingIdxOutOfRange {
                    op: OP,
                    padding_idx: p,
                    num_embeddings: num,
                });
            }
            Some(normalised)
        }
    };
    let mut counts = Vec::new();
    if options.scale_grad_by_freq {
        counts = vec![0usize; num];
        indices.iter().for_each(|&i| counts[i as usize] += 1);
    }
    grad_weight.fill(T::ZERO);
    for (p, &i) in indices.iter().enumerate() {
        if Some(i) == padding {
            continue;
        }
        let row = &mut grad_weight[i as usize * dim..][..dim];
        let grad = &grad_output[p * dim..][..dim];
        if options.scale_grad_by_freq {
            let scale = T::ONE / T::from_f64(counts[i as usize] as f64);
            row.iter_mut().zip(grad).for_each(|(r, &g)| *r += g * scale);
        } else {
            row.iter_mut().zip(grad).for_each(|(r, &g)| *r += g);
        }
    }
    Ok(())
}

/// `[outer, size, inner]` view of `shape` around `dim`.
fn split_at_dim(shape: &[usize], dim: usize) -> [usize; 3] {
    [
        shape[..dim].iter().product(),
        shape[dim],
        shape[dim + 1..].iter().product(),
    ]
}

/// `index_select(input, dim, index)`: the output has the input's shape with `shape[dim]`
/// replaced by `index.len()`.
pub fn index_select_forward<T: Copy + Send + Sync>(
    input: &[T],
    input_shape: &[usize],
    dim: usize,
    index: &[i64],
    output: &mut [T],
) -> Result<(), KernelError> {
    const OP: &str = "index_select";
    check_dim(OP, dim, input_shape.len())?;
    let [outer, size, inner] = split_at_dim(input_shape, dim);
    check_len(OP, "input", input, input_shape)?;
    check_len(OP, "output", output, &[outer, index.len(), inner])?;
    check_index_values(OP, index, &[index.len()], dim, size)?;
    if output.is_empty() {
        return Ok(());
    }
    par::chunks_mut(output, index.len() * inner, &|o, out| {
        let src = &input[o * size * inner..][..size * inner];
        for (row, &i) in out.chunks_mut(inner).zip(index) {
            row.copy_from_slice(&src[i as usize * inner..][..inner]);
        }
    });
    Ok(())
}

/// Gradient of `index_select`: adds each output-gradient slice back at its index (repeated
/// indices add up). `grad_input` (the input's shape) is overwritten.
pub fn index_select_backward<T: KernelFloat>(
    grad_output: &[T],
    input_shape: &[usize],
    dim: usize,
    index: &[i64],
    grad_input: &mut [T],
) -> Result<(), KernelError> {
    const OP: &str = "index_select_backward";
    check_dim(OP, dim, input_shape.len())?;
    let [outer, size, inner] = split_at_dim(input_shape, dim);
    check_len(OP, "grad_output", grad_output, &[outer, index.len(), inner])?;
    check_len(OP, "grad_input", grad_input, input_shape)?;
    check_index_values(OP, index, &[index.len()], dim, size)?;
    grad_input.fill(T::ZERO);
    if grad_input.is_empty() {
        return Ok(());
    }
    par::chunks_mut(grad_input, size * inner, &|o, gin| {
        let gout = &grad_output[o * index.len() * inner..][..index.len() * inner];
        for (row, &i) in gout.chunks(inner.max(1)).zip(index) {
            let dst = &mut gin[i as usize * inner..][..inner];
            dst.iter_mut().zip(row).for_each(|(d, &g)| *d += g);
        }
    });
    Ok(())
}

/// `gather(input, dim, index)`: `output[i][j][k] = input[i][index[i][j][k]][k]` (for
/// `dim = 1`); the output has the index's shape.
pub fn gather_forward<T: Copy>(
    input: &[T],
    input_shape: &[usize],
    index: DimIndex<'_>,
    output: &mut [T],
) -> Result<(), KernelError> {
    const OP: &str = "gather";
    check_dim(OP, index.dim, input_shape.len())?;
    check_len(OP, "input", input, input_shape)?;
    check_len(OP, "index", index.index, index.shape)?;
    check_len(OP, "output", output, index.shape)?;
    check_index_fits(OP, &index, "the input", input_shape, Some(index.dim))?;
    check_index_values(
        OP,
        index.index,
        index.shape,
        index.dim,
        input_shape[index.dim],
    )?;
    let (strides, dim_stride) = strides_without(input_shape, index.dim);
    walk(index.shape, [&strides], |flat, [base]| {
        output[flat] = input[base + index.index[flat] as usize * dim_stride];
    });
    Ok(())
}

/// Checks a scatter call and returns `(dest strides without dim, dest stride of dim, src
/// strides)`.
fn check_scatter<T>(
    op: &'static str,
    dest: &[T],
    dest_shape: &[usize],
    index: &DimIndex<'_>,
    src: Option<(&[T], &[usize])>,
) -> Result<(Vec<usize>, usize, Vec<usize>), KernelError> {
    check_dim(op, index.dim, dest_shape.len())?;
    check_len(op, "self", dest, dest_shape)?;
    check_len(op, "index", index.index, index.shape)?;
    let mut src_strides = Vec::new();
    if let Some((src, src_shape)) = src {
        check_len(op, "src", src, src_shape)?;
        check_index_fits(op, index, "src", src_shape, None)?;
        src_strides = contiguous_strides(src_shape);
    }
    check_index_fits(op, index, "self", dest_shape, Some(index.dim))?;
    check_index_values(
        op,
        index.index,
        index.shape,
        index.dim,
        dest_shape[index.dim],
    )?;
    let (strides, dim_stride) = strides_without(dest_shape, index.dim);
    Ok((strides, dim_stride, src_strides))
}

/// In-place `self.scatter_(dim, index, src)`: `self[i][index[i][j][k]][k] = src[i][j][k]`
/// (for `dim = 1`); with repeated indices the last write (row-major order) wins.
pub fn scatter_<T: Copy>(
    dest: &mut [T],
    dest_shape: &[usize],
    index: DimIndex<'_>,
    src: &[T],
    src_shape: &[usize],
) -> Result<(), KernelError> {
    let (strides, dim_stride, src_strides) =
        check_scatter("scatter", dest, dest_shape, &index, Some((src, src_shape)))?;
    walk(index.shape, [&strides, &src_strides], |flat, [base, s]| {
        dest[base + index.index[flat] as usize * dim_stride] = src[s];
    });
    Ok(())
}

/// In-place `self.scatter_add_(dim, index, src)`: `self[i][index[i][j][k]][k] += src[i][j][k]`
/// (for `dim = 1`).
pub fn scatter_add_<T: KernelFloat>(
    dest: &mut [T],
    dest_shape: &[usize],
    index: DimIndex<'_>,
    src: &[T],
    src_shape: &[usize],
) -> Result<(), KernelError> {
    let (strides, dim_stride, src_strides) = check_scatter(
        "scatter_add",
        dest,
        dest_shape,
        &index,
        Some((src, src_shape)),
    )?;
    walk(index.shape, [&strides, &src_strides], |flat, [base, s]| {
        dest[base + index.index[flat] as usize * dim_stride] += src[s];
    });
    Ok(())
}

/// In-place `self.scatter_(dim, index, value)`: writes `value` at every indexed position.
pub fn scatter_value_<T: Copy>(
    dest: &mut [T],
    dest_shape: &[usize],
    index: DimIndex<'_>,
    value: T,
) -> Result<(), KernelError> {
    let (strides, dim_stride, _) = check_scatter("scatter", dest, dest_shape, &index, None)?;
    walk(index.shape, [&strides], |flat, [base]| {
        dest[base + index.index[flat] as usize * dim_stride] = value;
    });
    Ok(())
}

/// Gradient of `gather`: `grad_input` (the input's shape) is overwritten with zeros plus the
/// `scatter_add` of `grad_output` (the index's shape) along `index.dim`.
pub fn gather_backward<T: KernelFloat>(
    grad_output: &[T],
    index: DimIndex<'_>,
    input_shape: &[usize],
    grad_input: &mut [T],
) -> Result<(), KernelError> {
    check_len("gather_backward", "grad_output", grad_output, index.shape)?;
    check_scatter("gather_backward", grad_input, input_shape, &index, None)?;
    grad_input.fill(T::ZERO);
    scatter_add_(grad_input, input_shape, index, grad_output, index.shape)
}

impl IndexOps for CpuStorage {
    fn embedding(&self, layout: &Layout, indices: Strided<'_, Self>) -> Result<Self> {
        let table = (self, layout);
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
        by_dtype!(table.0.dtype(), T => {
            let w = dense::<T>(OP, table)?;
            let mut out = zeros::<T>(&[idx.len(), embedding_dim])?;
            in_pool(|| embedding_forward(&shape, &w, &idx, &mut out))
                .map_err(|e| with_index_shape(e, indices.1.shape()))?;
            Ok(wrap(out))
        })
    }

    fn embedding_backward(
        &self,
        layout: &Layout,
        indices: Strided<'_, Self>,
        num_embeddings: usize,
        padding_idx: Option<i64>,
    ) -> Result<Self> {
        let grad = (self, layout);
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
            embedding_backward(&shape, &go, &idx, options, &mut gw)
                .map_err(|e| with_index_shape(e, indices.1.shape()))?;
            Ok(wrap(gw))
        })
    }

    fn index_select(&self, layout: &Layout, dim: usize, index: Strided<'_, Self>) -> Result<Self> {
        let x = (self, layout);
        const OP: &str = "index_select";
        let idx = dense::<i64>(OP, index)?;
        let mut out_shape = x.1.shape().to_vec();
        if dim < out_shape.len() {
            out_shape[dim] = idx.len();
        }
        by_dtype!(x.0.dtype(), T => {
            let input = dense::<T>(OP, x)?;
            let mut out = zeros::<T>(&out_shape)?;
            in_pool(|| index_select_forward(&input, x.1.shape(), dim, &idx, &mut out))?;
            Ok(wrap(out))
        })
    }

    fn index_select_backward(
        &self,
        layout: &Layout,
        input_shape: &[usize],
        dim: usize,
        index: Strided<'_, Self>,
    ) -> Result<Self> {
        let grad = (self, layout);
        const OP: &str = "index_select_backward";
        let idx = dense::<i64>(OP, index)?;
        float_kernel!(OP, grad.0.dtype(), T => {
            let go = dense::<T>(OP, grad)?;
            let mut gi = zeros::<T>(input_shape)?;
            in_pool(|| index_select_backward(&go, input_shape, dim, &idx, &mut gi))?;
            Ok(wrap(gi))
        })
    }

    fn gather(&self, layout: &Layout, dim: usize, index: Strided<'_, Self>) -> Result<Self> {
        let x = (self, layout);
        const OP: &str = "gather";
        let idx = dense::<i64>(OP, index)?;
        let index = DimIndex {
            dim,
            index: &idx,
            shape: index.1.shape(),
        };
        by_dtype!(x.0.dtype(), T => {
            let input = dense::<T>(OP, x)?;
            let mut out = zeros::<T>(index.shape)?;
            gather_forward(&input, x.1.shape(), index, &mut out)?;
            Ok(wrap(out))
        })
    }

    fn scatter(
        &self,
        layout: &Layout,
        dim: usize,
        index: Strided<'_, Self>,
        src: Strided<'_, Self>,
        accumulate: bool,
    ) -> Result<Self> {
        let x = (self, layout);
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
                scatter_add_(&mut dest, x.1.shape(), dim_index, &s, src.1.shape())?;
                Ok(wrap(dest))
            })
        } else {
            by_dtype!(x.0.dtype(), T => {
                let mut dest = dense::<T>(op, x)?.into_owned()?;
                let s = dense::<T>(op, src)?;
                scatter_(&mut dest, x.1.shape(), dim_index, &s, src.1.shape())?;
                Ok(wrap(dest))
            })
        }
    }
}

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
