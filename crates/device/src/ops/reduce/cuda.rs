//! CUDA reductions: the kernels of `reduce.cu`, launched with a plan from [`super::plan`].
//!
//! The view is split into the kept dims (which enumerate the outputs, row-major, like the CPU's
//! permuted layout) and the reduced dims (which enumerate one output's group); each part is
//! collapsed separately. [`plan::plan`] picks the block size and, when there are too few outputs
//! to fill the device (a whole-tensor sum), how many blocks share each output's group: pass 1
//! then writes one partial state per chunk into a scratch block of the caching allocator (freed
//! on return; stream order keeps it alive for the queued kernels) and pass 2 folds them.
//! [`plan::read_for`] picks straight or 16-byte vector reads when the reduced dims are innermost
//! and unit-stride, and tiles of outputs when the reduced dim lies outside unit-stride outputs.

use super::plan::{self, ReducePlan};
use super::ReduceOp;
use super::ReduceOps;
use crate::cuda::kernels::KernelSource;
use crate::cuda::launch::{collapse, function, launch_error, suffix};
use crate::error::{Error, Result};
use crate::storage::CudaStorage;
use crate::{DType, Device, Layout};
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// The kernels of this op family.
pub const REDUCE_KERNELS: KernelSource = KernelSource {
    file: "ops/reduce/reduce.cu",
    source: include_str!("reduce.cu"),
};

/// Bytes of one partial state of a sum (a `double` or an `i64`).
const SUM_STATE_BYTES: usize = 8;
/// Bytes of one partial `Extreme` state of reduce.cu (value, index, two flags).
const EXTREME_STATE_BYTES: usize = 24;

fn config(grid: u32, (x, y): (u32, u32)) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (x, y, 1),
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

impl ReduceOps for CudaStorage {
    /// Reduces `dims` of the view; the output is contiguous over the kept dims.
    fn reduce(&self, layout: &Layout, dims: &[usize], op: ReduceOp) -> Result<Self> {
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
        let sm_count = crate::cuda::device_properties(Device::Cuda(self.ordinal()))?.sm_count;
        let x = self.device_ptr();
        let read = plan::read_for(&kept_view, &red_view, x, dtype.size_in_bytes());
        let p = plan::plan(read, n_out as u64, r as u64, sm_count);
        let access = read.code();
        let state_bytes = match op {
            ReduceOp::Sum => SUM_STATE_BYTES,
            _ => EXTREME_STATE_BYTES,
        };
        // Partial states of pass 1 (none when every output is one chunk).
        let partial = if p.splits > 1 {
            let len = n_out * p.splits as usize * state_bytes;
            Some(CudaStorage::output(self.ordinal(), len, DType::U8)?.1)
        } else {
            None
        };
        let scratch = partial.as_ref().map_or(0, |s| s.device_ptr());
        let (dst, n_out, r) = (out.device_ptr(), n_out as u64, r as u64);
        let ReducePlan { splits, chunk, .. } = p;
        let (largest, want_index) = (
            i32::from(matches!(op, ReduceOp::Max | ReduceOp::ArgMax)),
            i32::from(matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin)),
        );
        let (values, indices) = if want_index == 1 {
            (0u64, dst)
        } else {
            (dst, 0u64)
        };
        let (name, combine) = match op {
            ReduceOp::Sum => (
                format!("kiln_reduce_sum_{}", suffix(dtype)),
                format!("kiln_reduce_sum_combine_{}", suffix(out_dtype)),
            ),
            _ => (
                format!("kiln_reduce_extreme_{}", suffix(dtype)),
                format!("kiln_reduce_extreme_combine_{}", suffix(dtype)),
            ),
        };
        let f = function(&stream, &REDUCE_KERNELS, &name)?;
        let mut launch = stream.launch_builder(&f);
        launch.arg(&x).arg(&kept_view).arg(&red_view);
        if op == ReduceOp::Sum {
            launch.arg(&dst);
        } else {
            launch.arg(&values).arg(&indices);
        }
        launch
            .arg(&scratch)
            .arg(&n_out)
            .arg(&r)
            .arg(&splits)
            .arg(&chunk)
            .arg(&access);
        if op != ReduceOp::Sum {
            launch.arg(&largest).arg(&want_index);
        }
        // SAFETY: signatures as in reduce.cu; the view was checked against `self`; `out` holds
        // n_out elements of the output dtype, the pointer the kernel does not write is null, and
        // `scratch` holds n_out * splits states when splits > 1 (it is not read otherwise). A
        // vector access was only picked for 16-byte aligned row starts (plan::read_for), and an outer
        // one with a 256-thread 2-D block.
        unsafe { launch.launch(config(p.grid, p.block)) }.map_err(|e| launch_error(&name, e))?;
        if splits > 1 {
            let f = function(&stream, &REDUCE_KERNELS, &combine)?;
            let mut launch = stream.launch_builder(&f);
            launch.arg(&scratch);
            if op == ReduceOp::Sum {
                launch.arg(&dst);
            } else {
                launch.arg(&values).arg(&indices);
            }
            launch.arg(&n_out).arg(&splits);
            if op != ReduceOp::Sum {
                launch.arg(&largest).arg(&want_index);
            }
            let grid = crate::cuda::launch::grid_for(n_out, 1);
            // SAFETY: signatures as in reduce.cu; pass 1 (queued before on the same stream)
            // wrote all n_out * splits states of `scratch`; outputs as above.
            unsafe { launch.launch(config(grid, (p.combine_threads, 1))) }
                .map_err(|e| launch_error(&combine, e))?;
        }
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
}
