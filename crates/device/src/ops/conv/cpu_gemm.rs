//! The pieces both CPU conv paths share (`cpu.rs` and `cpu_input_grad.rs`, one GEMM per image;
//! `cpu_chunked.rs`, one per chunk of images): the GEMM call on row-major operands, the
//! per-image block sizes, and the per-thread scratch of a rayon loop whose init cannot fail.
//!
//! Invariants: [`matmul_into`] asserts its slices hold the matrices its dims describe before it
//! calls `gemm`; [`ScratchFailure`] keeps the first allocation error and reports it after the
//! loop, so a failed scratch allocation is an error, never a panic.

use super::padded::{too_large, unfold_on, Padded};
use super::pieces::is_split;
use super::subsample::subsample_plane;
use super::Conv2dGeometry;
use crate::ops::gemm::Parallelism;
use crate::ops::KernelFloat;
use crate::storage::HostBuffer;
use crate::{Error, Result};
use kiln_alloc_cache::{AllocContext, ContextGuard, StepThread, StepThreadGuard};
use std::sync::Mutex;

/// Per-image and per-group block sizes of the GEMM-per-image path (`cpu.rs`) and its input
/// gradient by columns (`cpu_input_grad.rs`).
pub(super) struct Blocks<'a> {
    geometry: &'a Conv2dGeometry,
    /// See [`Conv2dGeometry::is_pointwise`].
    pub(super) pointwise: bool,
    /// See [`Conv2dGeometry::is_subsampling`] (the forward gathers its columns from the image,
    /// with no padded copy).
    pub(super) subsampled: bool,
    pub(super) groups: usize,
    /// `C_in/groups * H * W`.
    pub(super) in_group: usize,
    /// `C_out/groups * H_out * W_out`.
    pub(super) out_group: usize,
    /// `C_out/groups * C_in/groups * kH * kW`.
    pub(super) weight_group: usize,
    /// `C_out / groups`.
    pub(super) out_channels: usize,
    /// im2col rows.
    pub(super) col_rows: usize,
    /// im2col columns.
    pub(super) col_cols: usize,
}

impl<'a> Blocks<'a> {
    pub(super) fn new(g: &'a Conv2dGeometry) -> Self {
        let groups = g.params.groups;
        let col_cols = g.col_cols();
        let out_channels = g.out_channels / groups;
        Self {
            geometry: g,
            pointwise: g.is_pointwise(),
            subsampled: g.is_subsampling(),
            groups,
            in_group: g.in_channels / groups * g.input_size[0] * g.input_size[1],
            out_group: out_channels * col_cols,
            weight_group: out_channels * g.col_rows(),
            out_channels,
            col_rows: g.col_rows(),
            col_cols,
        }
    }

    /// Elements of one column buffer (none for a pointwise convolution), or the allocator's
    /// size error when the count overflows.
    pub(super) fn col_len(&self) -> Result<usize> {
        if self.pointwise {
            return Ok(0);
        }
        self.col_rows
            .checked_mul(self.col_cols)
            .ok_or_else(too_large)
    }

    /// Group `g`'s column matrix of one image: the input block itself for a pointwise
    /// convolution, its planes read at the stride for a subsampling one, else unfolded from the
    /// image's padded copy into `col` (on the pool when `gemm` is: a batch too small to fill
    /// it).
    pub(super) fn columns<'s, T: KernelFloat>(
        &self,
        (p, parallelism): (&Padded, Parallelism),
        image: &'s [T],
        padded: &[T],
        g: usize,
        col: &'s mut [T],
    ) -> &'s [T] {
        if self.pointwise {
            return &image[g * self.in_group..][..self.in_group];
        }
        let l = self.col_cols;
        if self.subsampled {
            let channels = self.geometry.in_channels / self.groups;
            for (c, row) in col[..channels * l].chunks_mut(l.max(1)).enumerate() {
                subsample_plane(self.geometry, image, g * channels + c, row);
            }
            return col;
        }
        unfold_on(
            (self.geometry, p),
            padded,
            g,
            col,
            [l, 0],
            is_split(parallelism),
        );
        col
    }
}

/// How a matrix operand is stored: as is (row-major `rows x cols`) or as the row-major
/// transpose (`cols x rows`).
#[derive(Clone, Copy)]
pub(super) enum Stored {
    AsIs,
    Transposed,
}

/// `dst[m x n] (+)= lhs[m x k] · rhs[k x n]`, `dst` row-major and contiguous.
#[allow(clippy::too_many_arguments)]
pub(super) fn matmul_into<T: KernelFloat>(
    dst: &mut [T],
    [m, n, k]: [usize; 3],
    lhs: &[T],
    lhs_stored: Stored,
    rhs: &[T],
    rhs_stored: Stored,
    accumulate: bool,
    parallelism: Parallelism,
) {
    let operands = (lhs, lhs_stored, rhs, rhs_stored);
    matmul_into_at(dst, [n, 1], [m, n, k], operands, accumulate, parallelism);
}

/// [`matmul_into`] for a `dst` whose element `(i, j)` is `dst[i * rs + j * cs]` (a block of a
/// wider matrix).
pub(super) fn matmul_into_at<T: KernelFloat>(
    dst: &mut [T],
    [rs, cs]: [usize; 2],
    [m, n, k]: [usize; 3],
    (lhs, lhs_stored, rhs, rhs_stored): (&[T], Stored, &[T], Stored),
    accumulate: bool,
    parallelism: Parallelism,
) {
    assert!(lhs.len() >= m * k && rhs.len() >= k * n);
    if m == 0 || n == 0 {
        return;
    }
    assert!(dst.len() > (m - 1) * rs + (n - 1) * cs);
    if k == 0 {
        if !accumulate {
            (0..m).for_each(|i| (0..n).for_each(|j| dst[i * rs + j * cs] = T::ZERO));
        }
        return;
    }
    // (row stride, column stride) of each operand.
    let (lhs_rs, lhs_cs) = match lhs_stored {
        Stored::AsIs => (k as isize, 1),
        Stored::Transposed => (1, m as isize),
    };
    let (rhs_rs, rhs_cs) = match rhs_stored {
        Stored::AsIs => (n as isize, 1),
        Stored::Transposed => (1, k as isize),
    };
    // SAFETY: the asserts above guarantee every element addressed through these strides lies
    // inside its slice; `T` is `f32` or `f64` (sealed), which `gemm` supports; `dst` does not
    // alias `lhs`/`rhs` (distinct borrows).
    unsafe {
        crate::ops::gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            cs as isize,
            rs as isize,
            accumulate,
            lhs.as_ptr(),
            lhs_cs,
            lhs_rs,
            rhs.as_ptr(),
            rhs_cs,
            rhs_rs,
            T::ONE,
            T::ONE,
            parallelism,
        );
    }
}

/// What a rayon task of a convolution carries from the op that started it: the caller's
/// allocation context when an allocation history is being recorded (the task's scratch is then
/// attributed to the op that asked for it instead of to nobody; `None`, at no cost, when nothing
/// records). Entered, it also keeps the task's scratch out of planned steps: which thread runs
/// which task, and so how many scratch buffers the pass's own thread takes, changes from step
/// to step.
pub(super) struct TaskContext(Option<AllocContext>);

/// The guards [`TaskContext::enter`] holds.
pub(super) type TaskGuards = (Option<ContextGuard>, StepThreadGuard);

impl TaskContext {
    /// The calling thread's context, to carry into the op's tasks.
    pub(super) fn of_caller() -> Self {
        TaskContext(AllocContext::is_recording_anywhere().then(AllocContext::current))
    }

    /// Enters it on the task's thread until the guards drop.
    pub(super) fn enter(&self) -> TaskGuards {
        (
            self.0.as_ref().map(AllocContext::enter),
            StepThread::OUTSIDE.enter(),
        )
    }
}

/// Per-thread scratch for a rayon loop whose init cannot fail: the first allocation error is
/// kept here and returned once the loop is over (the output it was filling is discarded).
pub(super) struct ScratchFailure(Mutex<Option<Error>>, TaskContext);

impl ScratchFailure {
    pub(super) fn new() -> Self {
        Self(Mutex::new(None), TaskContext::of_caller())
    }

    /// An unfilled scratch buffer of `len` elements that the loop body rewrites before reading
    /// ([`HostBuffer::for_overwrite`]), or `None` after recording why there is none.
    pub(super) fn take<T: KernelFloat>(&self, len: usize) -> Option<HostBuffer<T>> {
        let _context = self.1.enter();
        match HostBuffer::for_overwrite(len) {
            Ok(buf) => Some(buf),
            Err(e) => {
                let mut first = self.0.lock().unwrap_or_else(|p| p.into_inner());
                first.get_or_insert(e);
                None
            }
        }
    }

    /// `Err` with the first recorded failure, if any.
    pub(super) fn into_result(self) -> Result<()> {
        match self.0.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Output channels one task of [`sum_transposed_partials`] sums: a partial's row holds them
/// contiguously, so the task reads one cache line of f32 per row and partial.
const SUM_BLOCK: usize = 16;

/// `grad_weight[g][o][r] = Σ partial[g][r][o]` over `partials` in order: the per-slice weight
/// gradients, each group's block stored transposed (`[rows, outs]`), summed and transposed into
/// `[outs, rows]` per group.
///
/// A task takes a block of output channels (a divisor of `outs`, so never two groups) and walks
/// the rows, reading each partial's contiguous run of those channels: every line of every
/// partial is read by one task, once. (One task per channel, reading a value per row, would
/// read each line once per channel in it, a cost that grows with the partials, i.e. with the
/// threads, while the work it sums does not.) Each element's sum starts at zero and adds the
/// partials in order, so the result does not depend on the blocks.
pub(super) fn sum_transposed_partials<T: KernelFloat>(
    partials: &[HostBuffer<T>],
    rows: usize,
    outs: usize,
    grad_weight: &mut [T],
) {
    let group = rows * outs;
    if group == 0 {
        return; // No taps or no channels: an empty gradient.
    }
    let block = gcd(outs, SUM_BLOCK);
    crate::ops::par::chunks_mut(grad_weight, block * rows, &|b, gw_rows| {
        let (g, o0) = (b * block / outs, b * block % outs);
        let mut acc = [T::ZERO; SUM_BLOCK];
        let acc = &mut acc[..block];
        for r in 0..rows {
            let at = g * group + r * outs + o0;
            acc.fill(T::ZERO);
            for p in partials {
                for (a, &v) in acc.iter_mut().zip(&p.as_slice()[at..][..block]) {
                    *a += v;
                }
            }
            for (i, &a) in acc.iter().enumerate() {
                gw_rows[i * rows + r] = a;
            }
        }
    });
}

fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task's scratch is outside planned steps while its guards live, and the thread is its
    /// own again afterwards.
    #[test]
    fn tasks_take_their_scratch_outside_planned_steps() {
        let own = StepThread::current();
        let task = TaskContext::of_caller();
        {
            let _guards = task.enter();
            assert_eq!(StepThread::current(), StepThread::OUTSIDE);
        }
        assert_eq!(StepThread::current(), own);
    }

    /// Two groups of 20 output channels (blocks of 4, a divisor of 20, so no block spans two
    /// groups) and three partials: each element is the in-order sum of its transposed entries.
    #[test]
    fn partials_are_summed_and_transposed_per_group() {
        let (groups, rows, outs) = (2, 3, 20);
        let len = groups * rows * outs;
        let partials: Vec<HostBuffer<f64>> = (0..3)
            .map(|p| {
                let values = (0..len).map(|i| (i * 7 + p * 1000) as f64 * 0.5).collect();
                HostBuffer::try_from_vec(values).unwrap()
            })
            .collect();
        let mut grad_weight = vec![f64::NAN; len];
        sum_transposed_partials(&partials, rows, outs, &mut grad_weight);
        for g in 0..groups {
            for o in 0..outs {
                for r in 0..rows {
                    let at = g * rows * outs + r * outs + o;
                    let want: f64 = partials.iter().map(|p| p.as_slice()[at]).sum();
                    assert_eq!(grad_weight[(g * outs + o) * rows + r], want, "{g} {o} {r}");
                }
            }
        }
    }
}
