//! CUDA top-k over the last dim: the kernel of `topk.cu`, one thread per row.
//!
//! The leading dims enumerate rows (collapsed like any strided operand); the last dim is read
//! with its own stride, so a transposed view needs no copy. Outputs are contiguous.

use super::{rows_and_len, TopkOps};
use crate::cuda::kernels::KernelSource;
use crate::cuda::launch::{collapse, function, grid_for, launch_error, suffix};
use crate::error::Result;
use crate::storage::CudaStorage;
use crate::{DType, Layout};
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// The kernels of this op family.
pub const TOPK_KERNELS: KernelSource = KernelSource {
    file: "ops/topk/topk.cu",
    source: include_str!("topk.cu"),
};

/// Threads per block: one row each.
const BLOCK: u32 = 128;

impl TopkOps for CudaStorage {
    fn topk_last_dim(&self, layout: &Layout, k: usize, largest: bool) -> Result<(Self, Self)> {
        let (n_rows, d) = rows_and_len(layout, k, self.dtype())?;
        self.check_view("topk", layout)?;
        let n = n_rows * k;
        let (stream, values) = CudaStorage::output(self.ordinal(), n, self.dtype())?;
        let (_, indices) = CudaStorage::output(self.ordinal(), n, DType::I64)?;
        if n == 0 {
            return Ok((values, indices));
        }
        let rank = layout.rank();
        let col_stride = match rank {
            0 => 0,
            _ => layout.strides()[rank - 1],
        };
        let rows = Layout::new(
            layout.shape()[..rank.saturating_sub(1)].to_vec(),
            layout.strides()[..rank.saturating_sub(1)].to_vec(),
            layout.offset(),
        );
        let [rows_view] = collapse([&rows])?;
        let name = format!("kiln_topk_{}", suffix(self.dtype()));
        let f = function(&stream, &TOPK_KERNELS, &name)?;
        let (x, vals, idx) = (self.device_ptr(), values.device_ptr(), indices.device_ptr());
        let (col_stride, n_rows, d, k, largest) = (
            col_stride as u64,
            n_rows as u64,
            d as u64,
            k as u64,
            i32::from(largest),
        );
        let config = LaunchConfig {
            grid_dim: (grid_for(n_rows, BLOCK), 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = stream.launch_builder(&f);
        launch
            .arg(&x)
            .arg(&rows_view)
            .arg(&col_stride)
            .arg(&vals)
            .arg(&idx)
            .arg(&n_rows)
            .arg(&d)
            .arg(&k)
            .arg(&largest);
        // SAFETY: signature (const T*, StridedArgs, u64, T*, i64*, u64, u64, u64, int) as in
        // topk.cu; the view was checked against `self`; `values` and `indices` hold
        // n_rows * k elements each, and every row read lies in the checked view.
        unsafe { launch.launch(config) }.map_err(|e| launch_error(&name, e))?;
        Ok((values, indices))
    }
}
