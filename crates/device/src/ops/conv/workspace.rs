//! The scratch a convolution allocates beyond its results, per pass and device: what a memory
//! plan must add at the moment each pass runs.
//!
//! Invariants: the figures mirror the allocations of the kernels they describe, buffer by
//! buffer, each counted as the caching allocator hands it out (a multiple of 512 bytes), for
//! contiguous operands (a strided view would add a dense copy of itself); a test runs the kernels
//! and checks the allocator's peak equals them. Sizes are checked: a geometry whose scratch does
//! not fit in `usize` is an error, as it would be when the kernel allocates it.

use super::Conv2dGeometry;
use crate::seam::GradMask;
use crate::{checked_size, DType, Result};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The scratch of a convolution's passes on one device.
///
/// Backward is described moment by moment, because which moment is its peak depends on the
/// batch size (a plan that fits figures at two batch sizes and extrapolates needs each moment
/// separately: each is linear in the batch, their maximum is not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvWorkspace {
    /// Bytes alive during the forward pass at most, beyond its output.
    pub forward: usize,
    /// Bytes alive at each moment of the backward pass that can be its peak, beyond the
    /// gradient(s) of the pass that moment belongs to, counted as if they existed from the
    /// pass's start: a moment before its gradient is allocated holds that many bytes less, and
    /// is negative when the scratch then is smaller than the gradient.
    pub backward: Vec<i64>,
    /// The batch size from which these figures stop growing: the images a pass unfolds at a
    /// time ([`cuda_conv_images_per_chunk`] for an unbounded batch).
    pub batch_limit: usize,
}

impl ConvWorkspace {
    /// The most bytes backward holds beyond its gradients (the largest moment, or 0).
    pub fn backward_peak(&self) -> usize {
        self.backward
            .iter()
            .map(|&b| usize::try_from(b).unwrap_or(0))
            .max()
            .unwrap_or(0)
    }
}

/// The column budget a process starts with: 64 MiB. A chunk this size keeps every GEMM of
/// ResNet-style layers thousands of columns wide, while the whole batch's columns (hundreds of
/// MB for a 224x224 ResNet's early layers at batch 64) would be the largest buffers of a step.
pub const DEFAULT_CUDA_CONV_COLUMN_BUDGET: usize = 64 << 20;

static COLUMN_BUDGET: AtomicUsize = AtomicUsize::new(DEFAULT_CUDA_CONV_COLUMN_BUDGET);

/// The most bytes a CUDA convolution's column matrix may take: each pass unfolds as many images
/// at a time as fit (at least one), so its scratch stops growing with the batch.
pub fn cuda_conv_column_budget() -> usize {
    COLUMN_BUDGET.load(Ordering::Relaxed)
}

/// Sets [`cuda_conv_column_budget`] for every CUDA convolution from now on (the process-wide
/// setting, like cuDNN's workspace limit) and returns the previous budget. A smaller budget
/// trades GEMM width for memory; a memory plan made before the change describes the old budget.
/// Zero is refused: a convolution always unfolds at least one image.
pub fn set_cuda_conv_column_budget(bytes: usize) -> Result<usize> {
    if bytes == 0 {
        return Err(crate::Error::Unsupported {
            what: "a CUDA convolution column budget of 0 bytes; pass at least one image's \
                   columns (any budget below that unfolds one image at a time)",
        });
    }
    Ok(COLUMN_BUDGET.swap(bytes, Ordering::Relaxed))
}

/// Images of `g` unfolded at a time on CUDA in `dtype`: the most whose columns
/// (`C_in*kH*kW * L` elements each) fit [`cuda_conv_column_budget`], at least 1, at most the batch
/// (1 for an empty batch).
pub fn cuda_conv_images_per_chunk(g: &Conv2dGeometry, dtype: DType) -> Result<usize> {
    let per_image = checked_size(
        "conv2d",
        "one image's columns",
        &[
            g.in_channels,
            g.kernel_size[0],
            g.kernel_size[1],
            g.output_size[0],
            g.output_size[1],
            dtype.size_in_bytes(),
        ],
    )?;
    let fit = cuda_conv_column_budget() / per_image.max(1);
    Ok(fit.clamp(1, g.batch.max(1)))
}

/// The scratch of the CUDA kernels (`cuda.rs`) for `g` in `dtype`, backward computing the
/// gradients `mask` asks for. Each pass unfolds `n` images at a time
/// ([`cuda_conv_images_per_chunk`]); with `X = n * C_in*kH*kW * L` column elements (`L` output
/// positions) and `G = n * C_out * L` output-gradient elements, the peaks are at a full chunk:
/// - forward: the columns `X` (every group's GEMM writes into the output; the bias is added in
///   place);
/// - input gradient: the column gradient `X`;
/// - weight gradient: the columns, unfolded straight into the GEMM's order, with the transposed
///   output gradient (`X + G`); 16-bit weights also hold an f32 sum of the weight's size, which
///   replaces the 16-bit gradient until the end.
///
/// The bias gradient's reduction keeps a few bytes per output channel, below every moment.
pub fn cuda_conv2d_workspace(
    g: &Conv2dGeometry,
    dtype: DType,
    mask: GradMask,
) -> Result<ConvWorkspace> {
    const OP: &str = "conv2d workspace";
    let elem = dtype.size_in_bytes();
    let batch_limit = cuda_conv_images_per_chunk(
        &Conv2dGeometry {
            batch: usize::MAX,
            ..*g
        },
        dtype,
    )?;
    let n = batch_limit.min(g.batch);
    let l = checked_size(OP, "the output positions", &g.output_size)?;
    let rows = checked_size(
        OP,
        "the columns' rows",
        &[g.in_channels, g.kernel_size[0], g.kernel_size[1]],
    )?;
    // A buffer of `factors` elements of `elem` bytes as the allocator hands it out.
    let block = |what: &str, factors: &[usize], elem: usize| -> Result<i64> {
        let mut all = factors.to_vec();
        all.push(elem);
        let bytes = checked_size(OP, what, &all)?;
        let rounded = bytes.div_ceil(kiln_alloc_cache::MIN_BLOCK) * kiln_alloc_cache::MIN_BLOCK;
        i64::try_from(rounded).map_err(|_| too_large(what))
    };
    let cols = block("the columns", &[n, rows, l], elem)?;
    let forward = usize::try_from(cols).map_err(|_| too_large("forward"))?;
    let mut backward = Vec::new();
    if mask.input {
        backward.push(cols);
    }
    if mask.weight {
        let out_grad = block(
            "the transposed output gradient",
            &[n, g.out_channels, l],
            elem,
        )?;
        let weight = [g.out_channels, rows / g.params.groups];
        // The f32 sum of 16-bit weights, alive from the pass's start; at the end it meets the
        // 16-bit gradient rounded from it (a later moment, larger than the chunks' when the
        // weight outweighs a chunk's columns).
        let wide_sum = if matches!(dtype, DType::F16 | DType::BF16) {
            block("the f32 weight sum", &weight, 4)?
        } else {
            0
        };
        let ahead = if wide_sum > 0 {
            wide_sum - block("the weight gradient", &weight, elem)?
        } else {
            0
        };
        let moment = [cols, out_grad, ahead]
            .iter()
            .try_fold(0i64, |a, &b| a.checked_add(b))
            .ok_or_else(|| too_large("the scratch"))?;
        backward.push(moment);
        if wide_sum > 0 {
            backward.push(wide_sum);
        }
    }
    Ok(ConvWorkspace {
        forward,
        backward,
        batch_limit,
    })
}

fn too_large(what: &str) -> crate::Error {
    crate::Error::SizeOverflow {
        op: "conv2d workspace",
        what: format!("{what} holds more than i64::MAX bytes"),
    }
}
