//! CUDA softmax / log-softmax over the last dim: the kernel of `softmax.cu`, one block per row.
//!
//! The leading dims enumerate rows (collapsed like any strided operand); the last dim is read
//! with its own stride, so a transposed view needs no copy. Output is contiguous.

use super::SoftmaxOps;
use crate::cuda::kernels::KernelSource;
use crate::cuda::launch::{collapse, function, grid_for, launch_error, suffix};
use crate::error::{Error, Result};
use crate::storage::CudaStorage;
use crate::Layout;
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// The kernels of this op family.
pub const SOFTMAX_KERNELS: KernelSource = KernelSource {
    file: "ops/softmax/softmax.cu",
    source: include_str!("softmax.cu"),
};

impl SoftmaxOps for CudaStorage {
    /// Softmax (`log = false`) or log-softmax over the last dim of the view.
    fn softmax_last_dim(&self, layout: &Layout, log: bool) -> Result<Self> {
        if !self.dtype().is_float() {
            return Err(Error::UnsupportedDType {
                op: "softmax",
                dtype: self.dtype(),
                hint: "convert with to_dtype(DType::F32) first",
            });
        }
        self.check_view("softmax", layout)?;
        let n = layout.numel();
        let (stream, out) = CudaStorage::output(self.ordinal(), n, self.dtype())?;
        if n == 0 {
            return Ok(out);
        }
        let rank = layout.rank();
        let (d, col_stride) = match rank {
            0 => (1, 0),
            _ => (layout.shape()[rank - 1], layout.strides()[rank - 1]),
        };
        let rows = Layout::new(
            layout.shape()[..rank.saturating_sub(1)].to_vec(),
            layout.strides()[..rank.saturating_sub(1)].to_vec(),
            layout.offset(),
        );
        let [rows_view] = collapse([&rows])?;
        let n_rows = (n / d) as u64;
        let name = format!("kiln_softmax_{}", suffix(self.dtype()));
        let f = function(&stream, &SOFTMAX_KERNELS, &name)?;
        let (x, dst, col_stride, d, log) = (
            self.device_ptr(),
            out.device_ptr(),
            col_stride as u64,
            d as u64,
            i32::from(log),
        );
        let config = LaunchConfig {
            grid_dim: (grid_for(n_rows, 1), 1, 1),
            block_dim: (d.next_power_of_two().clamp(32, 256) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = stream.launch_builder(&f);
        launch
            .arg(&x)
            .arg(&rows_view)
            .arg(&col_stride)
            .arg(&dst)
            .arg(&n_rows)
            .arg(&d)
            .arg(&log);
        // SAFETY: signature (const T*, StridedArgs, u64, T*, u64, u64, int) as in softmax.cu; the
        // view was checked against `self`; `out` holds n_rows * d = n elements.
        unsafe { launch.launch(config) }.map_err(|e| launch_error(&name, e))?;
        Ok(out)
    }
}
