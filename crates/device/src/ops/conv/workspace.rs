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

/// The scratch of a convolution's passes on one device.
///
/// Backward is described moment by moment, because which moment is its peak depends on the
/// batch size (a plan that fits figures at two batch sizes and extrapolates needs each moment
/// separately: each is linear in the batch, their maximum is not).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConvWorkspace {
    /// Bytes alive during the forward pass at most, beyond its output.
    pub forward: usize,
    /// Bytes alive at each moment of the backward pass that can be its peak, beyond the
    /// gradient(s) of the pass that moment belongs to, counted as if they existed from the
    /// pass's start: a moment before its gradient is allocated holds that many bytes less, and
    /// is negative when the scratch then is smaller than the gradient.
    pub backward: Vec<i64>,
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

/// The scratch of the CUDA kernels (`cuda.rs`) for `g` in `dtype`, backward computing the
/// gradients `mask` asks for. With `X = N * C_in*kH*kW * L` column elements (`L` output
/// positions) and `G = N * C_out * L` output-gradient elements:
/// - forward: the columns `X`, plus one group's GEMM block when there are several groups (the
///   bias is added in place);
/// - input gradient: the column gradient `X` (with several groups, also one group's block
///   before the input gradient exists);
/// - weight gradient: the columns, unfolded straight into the GEMM's order, with the transposed
///   output gradient (`X + G`, plus one group's block with several).
///
/// The bias gradient's reduction keeps a few bytes per output channel, below every moment.
pub fn cuda_conv2d_workspace(
    g: &Conv2dGeometry,
    dtype: DType,
    mask: GradMask,
) -> Result<ConvWorkspace> {
    const OP: &str = "conv2d workspace";
    let groups = g.params.groups;
    let elem = dtype.size_in_bytes();
    let l = checked_size(OP, "the output positions", &g.output_size)?;
    let k = checked_size(
        OP,
        "the columns per group",
        &[g.in_channels / groups, g.kernel_size[0], g.kernel_size[1]],
    )?;
    // A buffer of `factors` elements as the allocator hands it out.
    let block = |what: &str, factors: &[usize]| -> Result<i64> {
        let mut all = factors.to_vec();
        all.push(elem);
        let bytes = checked_size(OP, what, &all)?;
        let rounded = bytes.div_ceil(kiln_alloc_cache::MIN_BLOCK) * kiln_alloc_cache::MIN_BLOCK;
        i64::try_from(rounded).map_err(|_| too_large(what))
    };
    let cols = block("the columns", &[g.batch, k, groups, l])?;
    let several = groups > 1;
    let sum = |parts: &[i64]| -> Result<i64> {
        parts
            .iter()
            .try_fold(0i64, |a, &b| a.checked_add(b))
            .ok_or_else(|| too_large("the scratch"))
    };
    let group_out = if several {
        block("a group's output", &[g.batch, g.out_channels / groups, l])?
    } else {
        0
    };
    let forward = usize::try_from(sum(&[cols, group_out])?).map_err(|_| too_large("forward"))?;
    let mut backward = Vec::new();
    if mask.input {
        backward.push(cols);
        if several {
            // Each group's block meets the column gradient before the input gradient exists.
            let group_cols = block("a group's columns", &[g.batch, k, l])?;
            let input_grad = block("the input gradient", &g.input_shape())?;
            backward.push(sum(&[cols, group_cols])? - input_grad);
        }
    }
    if mask.weight {
        let out_grad = block(
            "the transposed output gradient",
            &[g.batch, g.out_channels, l],
        )?;
        let group_weight = if several {
            block("a group's weight", &[g.out_channels / groups, k])?
        } else {
            0
        };
        backward.push(sum(&[cols, out_grad, group_weight])?);
    }
    Ok(ConvWorkspace { forward, backward })
}

fn too_large(what: &str) -> crate::Error {
    crate::Error::SizeOverflow {
        op: "conv2d workspace",
        what: format!("{what} holds more than i64::MAX bytes"),
    }
}
