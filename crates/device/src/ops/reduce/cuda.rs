//! CUDA reductions: the kernels of `reduce.cu`, one block per output.
//!
//! The view is split into the kept dims (which enumerate the outputs, row-major, like the CPU's
//! permuted layout) and the reduced dims (which enumerate one output's group); each part is
//! collapsed separately. The block size follows the group size (32 to 256 threads) so short
//! rows do not leave most of a block idle.

use crate::backend::ReduceOp;
use crate::cuda::kernels::KernelSource;
use crate::cuda::launch::{collapse, function, grid_for, launch_error, suffix};
use crate::error::{Error, Result};
use crate::storage::CudaStorage;
use crate::{BackendStorage, DType, Layout};
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// The kernels of this op family.
pub const REDUCE_KERNELS: KernelSource = KernelSource {
    file: "ops/reduce/reduce.cu",
    source: include_str!("reduce.cu"),
};

/// One block per output, `threads` a multiple of 32 fitted to the group size `r`.
fn reduce_config(n_out: u64, r: u64) -> LaunchConfig {
    let threads = r.next_power_of_two().clamp(32, 256) as u32;
    LaunchConfig {
        grid_dim: (grid_for(n_out, 1), 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The kept part (with the view's offset) and the reduced part (offset 0) of `layout`.
fn split(layout: &Layout, dims: &[usize]) -> (Layout, Layout) {
    let (shape, strides) = (layout.shape(), layout.strides());
    let pick = |keep: bool| -> (Vec<usize>, Vec<usize>) {
        (0..layout.rank())
            .filter(|d| dims.contains(d) != keep)
            .map(|d| (shape[d], strides[d]))
            .unzip()
    };
    let (ks, kst) = pick(true);
    let (rs, rst) = pick(false);
    (
        Layout::new(ks, kst, layout.offset()),
        Layout::new(rs, rst, 0),
    )
}

impl CudaStorage {
    /// Reduces `dims` of the view; the output is contiguous over the kept dims.
    pub(crate) fn reduce_cuda(
        &self,
        layout: &Layout,
        dims: &[usize],
        op: ReduceOp,
    ) -> Result<Self> {
        if let Some(&d) = dims.iter().find(|&&d| d >= layout.rank()) {
            return Err(Error::Kernel(crate::ops::KernelError::DimOutOfRange {
                op: "reduction",
                dim: d,
                ndim: layout.rank(),
            }));
        }
        self.check_view("reduction", layout)?;
        let (kept, red) = split(layout, dims);
        let (n_out, r) = (kept.numel(), red.numel());
        let dtype = self.dtype();
        let out_dtype = match op {
            ReduceOp::Sum if !dtype.is_float() => DType::I64,
            ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min => dtype,
            ReduceOp::ArgMax | ReduceOp::ArgMin => DType::I64,
        };
        let (stream, out) = CudaStorage::output(self.ordinal(), n_out, out_dtype)?;
        if n_out == 0 {
            return Ok(out);
        }
        let [kept_view] = collapse([&kept])?;
        let [red_view] = collapse([&red])?;
        let (x, dst, n_out, r) = (self.device_ptr(), out.device_ptr(), n_out as u64, r as u64);
        let config = reduce_config(n_out, r);
        let name = match op {
            ReduceOp::Sum => format!("kiln_reduce_sum_{}", suffix(dtype)),
            _ => format!("kiln_reduce_extreme_{}", suffix(dtype)),
        };
        let f = function(&stream, &REDUCE_KERNELS, &name)?;
        let mut launch = stream.launch_builder(&f);
        launch.arg(&x).arg(&kept_view).arg(&red_view);
        let (largest, want_index) = (
            i32::from(matches!(op, ReduceOp::Max | ReduceOp::ArgMax)),
            i32::from(matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin)),
        );
        let (values, indices) = if want_index == 1 {
            (0u64, dst)
        } else {
            (dst, 0u64)
        };
        if op == ReduceOp::Sum {
            launch.arg(&dst).arg(&n_out).arg(&r);
        } else {
            launch
                .arg(&values)
                .arg(&indices)
                .arg(&n_out)
                .arg(&r)
                .arg(&largest)
                .arg(&want_index);
        }
        // SAFETY: signatures as in reduce.cu; the view was checked against `self`; `out` holds
        // n_out elements of the output dtype, and the pointer the kernel does not write is null.
        unsafe { launch.launch(config) }.map_err(|e| launch_error(&name, e))?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_offset_on_the_outputs_only() {
        let l = Layout::contiguous(&[2, 3, 4]).narrow(2, 1, 2);
        let (kept, red) = split(&l, &[1]);
        assert_eq!(
            (kept.shape(), kept.strides(), kept.offset()),
            (&[2, 2][..], &[12, 1][..], 1)
        );
        assert_eq!(
            (red.shape(), red.strides(), red.offset()),
            (&[3][..], &[4][..], 0)
        );
    }

    #[test]
    fn blocks_fit_the_group() {
        assert_eq!(reduce_config(10, 3).block_dim.0, 32);
        assert_eq!(reduce_config(10, 100).block_dim.0, 128);
        assert_eq!(reduce_config(10, 1 << 20).block_dim.0, 256);
        assert_eq!(reduce_config(1 << 30, 4).grid_dim.0, 1 << 16);
    }
}
