//! CUDA indexing: `embedding`, `index_select`, `gather` (the "take" kernel of `index.cu`) and
//! `embedding_backward`, `index_select_backward`, `scatter`, `scatter_add` (the "put" kernel).
//!
//! Validation matches the CPU side: the shape rules of [`super`] are checked at the op, and every
//! index value on the device by a deferred check (`crates/device/src/cuda/deferred/mod.rs`) queued
//! before the take/put kernel, without waiting for the stream. A bad index is reported at the
//! calling thread's next synchronisation (a copy to the host such as `to_vec`/`item`, or
//! [`crate::synchronize`]) as [`Error::DeferredCheck`] holding the CPU's
//! [`KernelError::IndexOutOfRange`] (same value, coordinates, dim and size); with eager checks
//! (`KILN_CUDA_EAGER_CHECKS=1`, [`crate::set_eager_checks`]) the op waits and returns that
//! `KernelError` itself. The kernels never touch memory through a bad index: a take writes 0
//! (all-zero bytes) for it, a put skips it. Ops that add run in f32/f64 (16-bit floats widen to
//! f32 and round back once, as on the CPU); copies take every dtype.

use super::IndexOps;
use cudarc::driver::PushKernelArg;

use super::{check_dim, check_index_fits, DimIndex};
use crate::cuda::deferred::{self, IndexCheck};
use crate::cuda::kernels::KernelSource;
use crate::cuda::launch::{elementwise_config, function, launch_error, StridedArgs, MAX_DIMS};
use crate::error::{Error, Result};
use crate::ops::copy::CopyOps;
use crate::ops::kernel_error::KernelError;
use crate::storage::CudaStorage;
use crate::{contiguous_strides, DType, Layout};

/// The kernels of this op family.
pub const INDEX_KERNELS: KernelSource = KernelSource {
    file: "ops/index/index.cu",
    source: include_str!("index.cu"),
};

fn args(
    op: &'static str,
    offset: usize,
    shape: &[usize],
    strides: &[usize],
) -> Result<StridedArgs> {
    if shape.len() > MAX_DIMS {
        return Err(Error::Kernel(KernelError::InvalidShape {
            op,
            shape: shape.to_vec(),
            rule: format!("CUDA indexing kernels take at most {MAX_DIMS} dims; reshape first"),
        }));
    }
    Ok(StridedArgs::new(offset, shape, strides))
}

/// Index-view strides for index_select/embedding: 1 at `dim`, 0 elsewhere.
fn along(rank: usize, dim: usize) -> Vec<usize> {
    (0..rank).map(|d| usize::from(d == dim)).collect()
}

/// The index tensor as contiguous `I64` on the device, with its check against `[0, size)`
/// queued (see the module docs: a bad index is reported at the next synchronisation).
pub(crate) struct Indices {
    _keep: Option<CudaStorage>,
    /// Device address of the first index.
    pub(crate) ptr: u64,
}

pub(crate) fn indices(
    op: &'static str,
    (index, layout): (&CudaStorage, &Layout),
    dim: usize,
    size: usize,
) -> Result<Indices> {
    if index.dtype() != DType::I64 {
        return Err(Error::DTypeMismatch {
            op,
            lhs: DType::I64,
            rhs: index.dtype(),
        });
    }
    index.check_view(op, layout)?;
    let (keep, ptr) = if layout.is_contiguous() {
        (None, index.device_ptr() + 8 * layout.offset() as u64)
    } else {
        let copy = index.to_dtype(layout, DType::I64)?;
        let ptr = copy.device_ptr();
        (Some(copy), ptr)
    };
    let check = IndexCheck {
        op,
        indices: ptr,
        shape: layout.shape(),
        dim,
        size,
        ignore: None,
    };
    deferred::check_indices(index.ordinal(), check)?;
    Ok(Indices { _keep: keep, ptr })
}

impl CudaStorage {
    /// `out[c] = self[c with c[dim] = idx[idx_view(c)]]` over `out_shape`.
    fn take(
        &self,
        layout: &Layout,
        out_shape: &[usize],
        dim: usize,
        idx: &Indices,
        idx_strides: &[usize],
    ) -> Result<Self> {
        const OP: &str = "index";
        let n = out_shape.iter().product::<usize>();
        let (stream, out) = CudaStorage::output(self.ordinal(), n, self.dtype())?;
        if n == 0 {
            return Ok(out);
        }
        let src_view = args(OP, layout.offset(), out_shape, layout.strides())?;
        let idx_view = args(OP, 0, out_shape, idx_strides)?;
        let name = format!("kiln_take_b{}", self.dtype().size_in_bytes());
        let f = function(&stream, &INDEX_KERNELS, &name)?;
        let (src, dst, dim_u, n) = (self.device_ptr(), out.device_ptr(), dim as u32, n as u64);
        let size = layout.shape()[dim] as u64;
        let mut launch = stream.launch_builder(&f);
        launch
            .arg(&src)
            .arg(&src_view)
            .arg(&idx.ptr)
            .arg(&idx_view)
            .arg(&dim_u)
            .arg(&size)
            .arg(&dst)
            .arg(&n);
        // SAFETY: signature as in index.cu; the kernel reads only indices in [0, size of dim)
        // (it writes 0 for any other), and the other coordinates stay inside `out_shape`, which
        // the callers checked is no larger than the view (checked against `self`) in every dim
        // but `dim`.
        unsafe { launch.launch(elementwise_config(n)) }.map_err(|e| launch_error(&name, e))?;
        Ok(out)
    }

    /// Writes (or adds) `src` viewed over the iteration shape into `dst` (contiguous, of
    /// `dst_shape`) at the coordinates with `c[dim]` replaced by the index.
    #[allow(clippy::too_many_arguments)]
    fn put(
        dst: &mut Self,
        dst_shape: &[usize],
        (src, src_layout): (&Self, &Layout),
        dim: usize,
        idx: &Indices,
        idx_strides: &[usize],
        accumulate: bool,
        skip: Option<i64>,
    ) -> Result<()> {
        const OP: &str = "index";
        let n = src_layout.numel();
        if n == 0 {
            return Ok(());
        }
        let dst_view = args(OP, 0, dst_shape, &contiguous_strides(dst_shape))?;
        let src_view = args(
            OP,
            src_layout.offset(),
            src_layout.shape(),
            src_layout.strides(),
        )?;
        let idx_view = args(OP, 0, src_layout.shape(), idx_strides)?;
        let name = match (accumulate, dst.dtype()) {
            (true, DType::F32) => "kiln_put_add_f32".to_string(),
            (true, DType::F64) => "kiln_put_add_f64".to_string(),
            (true, other) => {
                return Err(Error::UnsupportedDType {
                    op: OP,
                    dtype: other,
                    hint: "index additions run on f32/f64",
                })
            }
            (false, d) => format!("kiln_put_b{}", d.size_in_bytes()),
        };
        let stream = crate::storage::cuda_stream(dst.ordinal())?;
        let f = function(&stream, &INDEX_KERNELS, &name)?;
        let (d_ptr, s_ptr, dim_u, n) = (dst.device_ptr(), src.device_ptr(), dim as u32, n as u64);
        let (has_skip, skip) = (i32::from(skip.is_some()), skip.unwrap_or(0));
        let mut launch = stream.launch_builder(&f);
        launch
            .arg(&d_ptr)
            .arg(&dst_view)
            .arg(&s_ptr)
            .arg(&src_view)
            .arg(&idx.ptr)
            .arg(&idx_view)
            .arg(&dim_u)
            .arg(&n)
            .arg(&has_skip)
            .arg(&skip);
        // SAFETY: signature as in index.cu; the kernel skips indices outside dst's size along
        // `dim` (dst_view's shape), the iteration shape is no larger than `dst_shape` in the other dims (checked by
        // the callers), and `src_layout` was checked against `src`.
        unsafe { launch.launch(elementwise_config(n)) }.map_err(|e| launch_error(&name, e))?;
        Ok(())
    }

    /// Runs `body` in f32/f64: 16-bit floats are widened to f32 (contiguous) first and the
    /// result is rounded back, as the CPU's `float_kernel!` does.
    fn in_float(
        &self,
        op: &'static str,
        layout: &Layout,
        body: impl FnOnce(&Self, &Layout) -> Result<Self>,
    ) -> Result<Self> {
        match self.dtype() {
            DType::F32 | DType::F64 => body(self, layout),
            half @ (DType::F16 | DType::BF16) => {
                let wide = self.to_dtype(layout, DType::F32)?;
                let r = body(&wide, &Layout::contiguous(layout.shape()))?;
                r.to_dtype(&Layout::contiguous(&[r.len()]), half)
            }
            other => Err(Error::UnsupportedDType {
                op,
                dtype: other,
                hint: "this kernel runs on floating-point tensors; convert with \
                       to_dtype(DType::F32) first",
            }),
        }
    }
}

impl IndexOps for CudaStorage {
    /// `embedding`: rows of the `[num, dim]` table picked by `indices`.
    fn embedding(&self, layout: &Layout, (index, index_layout): (&Self, &Layout)) -> Result<Self> {
        const OP: &str = "embedding";
        let [num, width]: [usize; 2] = layout.shape().try_into().map_err(|_| {
            Error::from(KernelError::InvalidShape {
                op: OP,
                shape: layout.shape().to_vec(),
                rule: "the weight must be 2-D [num_embeddings, embedding_dim]".into(),
            })
        })?;
        self.same_device(OP, index)?;
        self.check_view(OP, layout)?;
        let idx = indices(OP, (index, index_layout), 0, num)?;
        let rows = index_layout.numel();
        self.take(layout, &[rows, width], 0, &idx, &along(2, 0))
    }
    /// Gradient of the embedding table: rows of `self` summed per index (none for `padding_idx`).
    fn embedding_backward(
        &self,
        layout: &Layout,
        (index, index_layout): (&Self, &Layout),
        num_embeddings: usize,
        padding_idx: Option<i64>,
    ) -> Result<Self> {
        const OP: &str = "embedding_backward";
        self.same_device(OP, index)?;
        self.check_view(OP, layout)?;
        let width = layout.shape().last().copied().unwrap_or(1);
        let rows = index_layout.numel();
        if layout.numel() != rows * width {
            return Err(Error::Kernel(KernelError::BufferLength {
                op: OP,
                buffer: "grad_output",
                shape: vec![rows, width],
                expected: rows * width,
                actual: layout.numel(),
            }));
        }
        let idx = indices(OP, (index, index_layout), 0, num_embeddings)?;
        self.in_float(OP, layout, |grad, gl| {
            let grad = grad.to_dtype(gl, grad.dtype())?; // contiguous, viewed as [rows, width]
            let total = crate::checked_size(OP, "the weight gradient", &[num_embeddings, width])?;
            let mut out = CudaStorage::full_cuda(grad.ordinal(), total, 0.0, grad.dtype())?;
            let view = Layout::contiguous(&[rows, width]);
            let dst_shape = [num_embeddings, width];
            CudaStorage::put(
                &mut out,
                &dst_shape,
                (&grad, &view),
                0,
                &idx,
                &along(2, 0),
                true,
                padding_idx,
            )?;
            Ok(out)
        })
    }
    /// `index_select(self, dim, index)` with a 1-D index.
    fn index_select(
        &self,
        layout: &Layout,
        dim: usize,
        (index, index_layout): (&Self, &Layout),
    ) -> Result<Self> {
        const OP: &str = "index_select";
        check_dim(OP, dim, layout.rank())?;
        self.same_device(OP, index)?;
        self.check_view(OP, layout)?;
        let idx = indices(OP, (index, index_layout), dim, layout.shape()[dim])?;
        let mut out_shape = layout.shape().to_vec();
        out_shape[dim] = index_layout.numel();
        self.take(layout, &out_shape, dim, &idx, &along(out_shape.len(), dim))
    }
    /// Gradient of `index_select`: `self` (the output gradient) index-added into zeros of
    /// `input_shape`.
    fn index_select_backward(
        &self,
        layout: &Layout,
        input_shape: &[usize],
        dim: usize,
        (index, index_layout): (&Self, &Layout),
    ) -> Result<Self> {
        const OP: &str = "index_select_backward";
        check_dim(OP, dim, input_shape.len())?;
        self.same_device(OP, index)?;
        self.check_view(OP, layout)?;
        let mut grad_shape = input_shape.to_vec();
        grad_shape[dim] = index_layout.numel();
        if layout.shape() != grad_shape {
            return Err(Error::Kernel(KernelError::BufferLength {
                op: OP,
                buffer: "grad_output",
                shape: grad_shape.clone(),
                expected: grad_shape.iter().product(),
                actual: layout.numel(),
            }));
        }
        let idx = indices(OP, (index, index_layout), dim, input_shape[dim])?;
        self.in_float(OP, layout, |grad, gl| {
            let numel = crate::checked_shape_numel(OP, input_shape)?;
            let mut out = CudaStorage::full_cuda(grad.ordinal(), numel, 0.0, grad.dtype())?;
            let strides = along(input_shape.len(), dim);
            CudaStorage::put(
                &mut out,
                input_shape,
                (grad, gl),
                dim,
                &idx,
                &strides,
                true,
                None,
            )?;
            Ok(out)
        })
    }
    /// `gather(self, dim, index)`: the output has the index's shape.
    fn gather(
        &self,
        layout: &Layout,
        dim: usize,
        (index, index_layout): (&Self, &Layout),
    ) -> Result<Self> {
        const OP: &str = "gather";
        check_dim(OP, dim, layout.rank())?;
        self.same_device(OP, index)?;
        self.check_view(OP, layout)?;
        let shape = index_layout.shape();
        let fit = DimIndex {
            dim,
            index: &[],
            shape,
        };
        check_index_fits(OP, &fit, "the input", layout.shape(), Some(dim))?;
        let idx = indices(OP, (index, index_layout), dim, layout.shape()[dim])?;
        self.take(layout, shape, dim, &idx, &contiguous_strides(shape))
    }
    /// Out-of-place `scatter` / `scatter_add` of `src` into a copy of `self` along `dim`.
    fn scatter(
        &self,
        layout: &Layout,
        dim: usize,
        (index, index_layout): (&Self, &Layout),
        (src, src_layout): (&Self, &Layout),
        accumulate: bool,
    ) -> Result<Self> {
        let op = if accumulate { "scatter_add" } else { "scatter" };
        check_dim(op, dim, layout.rank())?;
        self.same_device(op, index)?;
        self.same_device(op, src)?;
        if src.dtype() != self.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: self.dtype(),
                rhs: src.dtype(),
            });
        }
        self.check_view(op, layout)?;
        src.check_view(op, src_layout)?;
        let shape = index_layout.shape();
        let fit = DimIndex {
            dim,
            index: &[],
            shape,
        };
        check_index_fits(op, &fit, "src", src_layout.shape(), None)?;
        check_index_fits(op, &fit, "self", layout.shape(), Some(dim))?;
        let idx = indices(op, (index, index_layout), dim, layout.shape()[dim])?;
        // `src` read at the index's coordinates, through its own strides.
        let src_at = Layout::new(
            shape.to_vec(),
            src_layout.strides().to_vec(),
            src_layout.offset(),
        );
        let strides = contiguous_strides(shape);
        let dst_shape = layout.shape();
        if accumulate {
            // Both operands go through f32 for 16-bit floats.
            let (wide_src, wide_src_at) = match src.dtype() {
                DType::F16 | DType::BF16 => {
                    let w = src.to_dtype(&src_at, DType::F32)?;
                    (Some(w), Layout::contiguous(shape))
                }
                _ => (None, src_at.clone()),
            };
            self.in_float(op, layout, |dest, dl| {
                let mut out = dest.to_dtype(dl, dest.dtype())?;
                let s = wide_src.as_ref().unwrap_or(src);
                CudaStorage::put(
                    &mut out,
                    dst_shape,
                    (s, &wide_src_at),
                    dim,
                    &idx,
                    &strides,
                    true,
                    None,
                )?;
                Ok(out)
            })
        } else {
            let mut out = self.to_dtype(layout, self.dtype())?;
            CudaStorage::put(
                &mut out,
                dst_shape,
                (src, &src_at),
                dim,
                &idx,
                &strides,
                false,
                None,
            )?;
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_views_and_the_dim_limit() {
        assert_eq!(along(3, 1), vec![0, 1, 0]);
        assert!(args("t", 0, &[1; 9], &[1; 9]).is_err());
    }
}
