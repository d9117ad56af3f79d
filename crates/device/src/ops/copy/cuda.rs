//! CUDA copies and casts: the kernels of `copy.cu`, launched on the buffers' stream.
//!
//! `contiguous()` of a view and `to_dtype` are one kernel family (`kiln_cast_<src>_<dst>`, the
//! same-dtype instantiation being a plain gather); `copy_into` scatters through a strided
//! destination with a bit-copy kernel per element size. Views are bounds-checked against the
//! buffers before launch; nothing waits on the stream.

use super::CopyOps;
use crate::cuda::kernels::KernelSource;
use crate::cuda::launch::{collapse, elementwise_config, function, launch_error, suffix};
use crate::error::{Error, Result};
use crate::storage::CudaStorage;
use crate::{DType, Layout};
use cudarc::driver::PushKernelArg;

/// The kernels of this op family.
pub const COPY_KERNELS: KernelSource = KernelSource {
    file: "ops/copy/copy.cu",
    source: include_str!("copy.cu"),
};

impl CopyOps for CudaStorage {
    /// The elements of `layout` converted to `dtype` (the same dtype: a copy), contiguous.
    fn to_dtype(&self, layout: &Layout, dtype: DType) -> Result<Self> {
        self.check_view("to_dtype", layout)?;
        let n = layout.numel();
        let (stream, out) = CudaStorage::output(self.ordinal(), n, dtype)?;
        if n == 0 {
            return Ok(out);
        }
        let name = format!("kiln_cast_{}_{}", suffix(self.dtype()), suffix(dtype));
        let f = function(&stream, &COPY_KERNELS, &name)?;
        let [view] = collapse([layout])?;
        let (src, dst, n) = (self.device_ptr(), out.device_ptr(), n as u64);
        let mut launch = stream.launch_builder(&f);
        launch.arg(&src).arg(&view).arg(&dst).arg(&n);
        // SAFETY: signature (const S*, StridedArgs, D*, u64) as in copy.cu; `check_view` proved
        // every read is inside `self`, and `out` holds exactly n elements of `dtype`.
        unsafe { launch.launch(elementwise_config(n)) }.map_err(|e| launch_error(&name, e))?;
        Ok(out)
    }
    /// Writes the elements of `layout` into `dst` through `dst_layout` (same shape, same dtype).
    fn copy_into(&self, layout: &Layout, dst: &mut Self, dst_layout: &Layout) -> Result<()> {
        self.same_device("copy", dst)?;
        if self.dtype() != dst.dtype() {
            return Err(Error::DTypeMismatch {
                op: "copy",
                lhs: self.dtype(),
                rhs: dst.dtype(),
            });
        }
        if layout.shape() != dst_layout.shape() {
            return Err(Error::LengthMismatch {
                op: "copy",
                what: format!(
                    "source shape {:?} differs from destination shape {:?}",
                    layout.shape(),
                    dst_layout.shape()
                ),
            });
        }
        self.check_view("copy", layout)?;
        dst.check_view("copy", dst_layout)?;
        let n = layout.numel() as u64;
        if n == 0 {
            return Ok(());
        }
        let name = format!("kiln_copy_into_b{}", self.dtype().size_in_bytes());
        let stream = crate::storage::cuda_stream(self.ordinal())?;
        let f = function(&stream, &COPY_KERNELS, &name)?;
        let [src_view, dst_view] = collapse([layout, dst_layout])?;
        let (src, dst_ptr) = (self.device_ptr(), dst.device_ptr());
        let mut launch = stream.launch_builder(&f);
        launch
            .arg(&src)
            .arg(&src_view)
            .arg(&dst_ptr)
            .arg(&dst_view)
            .arg(&n);
        // SAFETY: signature (const T*, StridedArgs, T*, StridedArgs, u64) as in copy.cu; both
        // views were checked against their buffers, which are distinct (`&self`, `&mut dst`).
        unsafe { launch.launch(elementwise_config(n)) }.map_err(|e| launch_error(&name, e))?;
        Ok(())
    }

    fn copy_contiguous(&self, layout: &Layout) -> Result<Self> {
        if self.layout_is_whole(layout) {
            return self.try_clone();
        }
        self.to_dtype(layout, self.dtype())
    }
}
