//! 2-D pooling: `max_pool2d` (with indices for backward, or without when no backward follows),
//! `avg_pool2d`, `adaptive_avg_pool2d`.
//!
//! Layouts are PyTorch's, contiguous: input `[N, C, H, W]`, output `[N, C, H_out, W_out]`;
//! max-pooling indices are `i64` offsets into the input plane (`h * W + w`), exactly as
//! `torch.nn.functional.max_pool2d(..., return_indices=True)` returns them, so they can be fed
//! to `max_unpool2d`-style code unchanged.
//!
//! Output sizes follow PyTorch's `pooling_output_shape`:
//! `out = floor((in + 2 * pad - dil * (k - 1) - 1 + (ceil_mode ? stride - 1 : 0)) / stride) + 1`,
//! minus one when `ceil_mode` makes the last window start inside the right padding. Padding may
//! be at most half the kernel size. Adaptive pooling gives output cell `o` the input range
//! `[floor(o * in / out), ceil((o + 1) * in / out))`.
//!
//! One deliberate difference from PyTorch: a max-pooling window that covers only padding (a
//! corner case of dilation plus `ceil_mode`) is an error here; PyTorch returns `-inf` with an
//! index outside the input plane, which its backward then writes through.
//!
//! The geometry types validate everything once; the kernels in [`cpu`] check slice lengths and
//! (in max-pool backward) index values.

pub mod cpu;
mod cpu_max;
#[cfg(feature = "cuda")]
pub mod cuda;

use super::kernel_error::{check_nonzero, KernelError};
use crate::ops::buffer::BufferOps;
use crate::seam::{pass_through, seam_trait, Strided};
use crate::{Error, Layout, Result};

/// A 2-D pooling op and its validated geometry (input `[N, C, H, W]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool2d {
    /// `max_pool2d`; its forward also returns the `I64` argmax indices backward needs.
    Max(MaxPool2dGeometry),
    /// `max_pool2d` with no backward to follow (`no_grad`, or an input that needs no
    /// gradient): the same values, no indices. The CPU keeps no winners at all (PyTorch's CPU
    /// `max_pool2d` does the same); CUDA computes the indices and drops them. Has no backward.
    MaxValues(MaxPool2dGeometry),
    /// `avg_pool2d`.
    Avg(AvgPool2dGeometry),
    /// `adaptive_avg_pool2d`.
    AdaptiveAvg(AdaptiveAvgPool2dGeometry),
}

pass_through!(ref Pool2d);

seam_trait! {
    /// 2-D pooling over `[N, C, H, W]`.
    pub trait PoolOps: BufferOps {
        /// A 2-D pooling of `self`; `Pool2d::Max` also returns its `I64` indices
        /// (`Pool2d::MaxValues` none).
        fn pool2d(&self, layout: &Layout, pool: &Pool2d) -> Result<(Self, Option<Self>)>;
        /// Gradient of a 2-D pooling from `self` = the output gradient (`indices` for max
        /// pooling).
        op("max_pool2d_backward")
        fn pool2d_backward(
            &self,
            layout: &Layout,
            indices: Option<Strided<'_, Self>>,
            pool: &Pool2d,
        ) -> Result<Self>;
    }
}

/// The error of a backward through [`Pool2d::MaxValues`], which keeps no indices.
pub(crate) fn no_values_backward() -> Error {
    Error::LengthMismatch {
        op: "max_pool2d_backward",
        what: "got Pool2d::MaxValues, which keeps no indices; run the forward as Pool2d::Max \
               (kiln's autograd does whenever the input needs a gradient)"
            .into(),
    }
}

const AXES: [&str; 2] = ["height", "width"];

/// Parameters of [`cpu::max_pool2d_forward`], as `[height, width]` pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxPool2dParams {
    /// Window size.
    pub kernel_size: [usize; 2],
    /// Step between windows (PyTorch defaults it to `kernel_size`).
    pub stride: [usize; 2],
    /// Implicit `-inf` padding on both sides; at most `kernel_size / 2`.
    pub padding: [usize; 2],
    /// Spacing between window taps.
    pub dilation: [usize; 2],
    /// Round the output size up instead of down.
    pub ceil_mode: bool,
}

impl MaxPool2dParams {
    /// A `kernel_size` window with PyTorch's defaults: stride = kernel, no padding, dilation 1,
    /// floor mode.
    pub fn new(kernel_size: [usize; 2]) -> Self {
        Self {
            kernel_size,
            stride: kernel_size,
            padding: [0, 0],
            dilation: [1, 1],
            ceil_mode: false,
        }
    }
}

/// Parameters of [`cpu::avg_pool2d_forward`], as `[height, width]` pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AvgPool2dParams {
    /// Window size.
    pub kernel_size: [usize; 2],
    /// Step between windows (PyTorch defaults it to `kernel_size`).
    pub stride: [usize; 2],
    /// Implicit zero padding on both sides; at most `kernel_size / 2`.
    pub padding: [usize; 2],
    /// Round the output size up instead of down.
    pub ceil_mode: bool,
    /// Count padding zeros in the divisor (PyTorch's default: true).
    pub count_include_pad: bool,
    /// Divide every window sum by this instead of the window size.
    pub divisor_override: Option<usize>,
}

impl AvgPool2dParams {
    /// A `kernel_size` window with PyTorch's defaults: stride = kernel, no padding, floor mode,
    /// `count_include_pad`, no divisor override.
    pub fn new(kernel_size: [usize; 2]) -> Self {
        Self {
            kernel_size,
            stride: kernel_size,
            padding: [0, 0],
            ceil_mode: false,
            count_include_pad: true,
            divisor_override: None,
        }
    }
}

/// Batch, channels and spatial sizes of a pooling op, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolShape {
    /// Batch size `N`.
    pub batch: usize,
    /// Channels `C`.
    pub channels: usize,
    /// Input `[H, W]`.
    pub input_size: [usize; 2],
    /// Output `[H_out, W_out]`.
    pub output_size: [usize; 2],
}

impl PoolShape {
    /// `[N, C, H, W]`.
    pub fn input_shape(&self) -> [usize; 4] {
        [
            self.batch,
            self.channels,
            self.input_size[0],
            self.input_size[1],
        ]
    }

    /// `[N, C, H_out, W_out]`.
    pub fn output_shape(&self) -> [usize; 4] {
        [
            self.batch,
            self.channels,
            self.output_size[0],
            self.output_size[1],
        ]
    }

    fn input_plane(&self) -> usize {
        self.input_size[0] * self.input_size[1]
    }

    fn output_plane(&self) -> usize {
        self.output_size[0] * self.output_size[1]
    }
}

/// A validated max pooling: what the max-pool kernels take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MaxPool2dGeometry {
    /// Sizes.
    pub shape: PoolShape,
    /// Parameters.
    pub params: MaxPool2dParams,
}

/// A validated average pooling: what the avg-pool kernels take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct AvgPool2dGeometry {
    /// Sizes.
    pub shape: PoolShape,
    /// Parameters.
    pub params: AvgPool2dParams,
}

/// A validated adaptive average pooling: what the adaptive-pool kernels take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct AdaptiveAvgPool2dGeometry {
    /// Sizes (the output size is the requested one).
    pub shape: PoolShape,
}

/// Rejects empty input planes.
fn check_input_plane(op: &'static str, input_shape: [usize; 4]) -> Result<(), KernelError> {
    if input_shape[2] == 0 || input_shape[3] == 0 {
        return Err(KernelError::InvalidShape {
            op,
            shape: input_shape.to_vec(),
            rule: "the input plane (H, W) must be non-empty; pass an input of at least 1x1".into(),
        });
    }
    Ok(())
}

/// Checks the window parameters of one axis and returns its output size.
#[allow(clippy::too_many_arguments)]
fn pooled_size(
    op: &'static str,
    axis: usize,
    input: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
    ceil_mode: bool,
) -> Result<usize, KernelError> {
    if padding > kernel / 2 {
        return Err(KernelError::PaddingTooLarge {
            op,
            axis: AXES[axis],
            padding,
            kernel,
        });
    }
    let window = dilation * (kernel - 1) + 1;
    let padded_input = input + 2 * padding;
    let round_up = if ceil_mode { stride - 1 } else { 0 };
    let numerator = padded_input as i64 - window as i64 + round_up as i64;
    let mut out = numerator.div_euclid(stride as i64) + 1;
    if ceil_mode && (out - 1) * stride as i64 >= (input + padding) as i64 {
        out -= 1;
    }
    if out < 1 {
        return Err(KernelError::WindowLargerThanInput {
            op,
            axis: AXES[axis],
            window,
            padded_input,
        });
    }
    Ok(out as usize)
}

impl MaxPool2dGeometry {
    /// Validates max pooling of an `[N, C, H, W]` input.
    pub fn new(input_shape: [usize; 4], params: MaxPool2dParams) -> Result<Self, KernelError> {
        const OP: &str = "max_pool2d";
        let p = &params;
        check_nonzero(OP, "kernel_size", p.kernel_size[0].min(p.kernel_size[1]))?;
        check_nonzero(OP, "stride", p.stride[0].min(p.stride[1]))?;
        check_nonzero(OP, "dilation", p.dilation[0].min(p.dilation[1]))?;
        check_input_plane(OP, input_shape)?;
        let mut output_size = [0; 2];
        for axis in 0..2 {
            let input = input_shape[2 + axis];
            output_size[axis] = pooled_size(
                OP,
                axis,
                input,
                p.kernel_size[axis],
                p.stride[axis],
                p.padding[axis],
                p.dilation[axis],
                p.ceil_mode,
            )?;
            for output_index in 0..output_size[axis] {
                let start = (output_index * p.stride[axis]) as i64 - p.padding[axis] as i64;
                let covers_input = (0..p.kernel_size[axis]).any(|tap| {
                    let position = start + (tap * p.dilation[axis]) as i64;
                    (0..input as i64).contains(&position)
                });
                if !covers_input {
                    return Err(KernelError::EmptyPoolingWindow {
                        op: OP,
                        axis: AXES[axis],
                        output_index,
                    });
                }
            }
        }
        let shape = PoolShape {
            batch: input_shape[0],
            channels: input_shape[1],
            input_size: [input_shape[2], input_shape[3]],
            output_size,
        };
        Ok(Self { shape, params })
    }
}

impl AvgPool2dGeometry {
    /// Validates average pooling of an `[N, C, H, W]` input.
    pub fn new(input_shape: [usize; 4], params: AvgPool2dParams) -> Result<Self, KernelError> {
        const OP: &str = "avg_pool2d";
        let p = &params;
        check_nonzero(OP, "kernel_size", p.kernel_size[0].min(p.kernel_size[1]))?;
        check_nonzero(OP, "stride", p.stride[0].min(p.stride[1]))?;
        if let Some(divisor) = p.divisor_override {
            check_nonzero(OP, "divisor_override", divisor)?;
        }
        check_input_plane(OP, input_shape)?;
        let mut output_size = [0; 2];
        for axis in 0..2 {
            output_size[axis] = pooled_size(
                OP,
                axis,
                input_shape[2 + axis],
                p.kernel_size[axis],
                p.stride[axis],
                p.padding[axis],
                1,
                p.ceil_mode,
            )?;
        }
        let shape = PoolShape {
            batch: input_shape[0],
            channels: input_shape[1],
            input_size: [input_shape[2], input_shape[3]],
            output_size,
        };
        Ok(Self { shape, params })
    }
}

impl AdaptiveAvgPool2dGeometry {
    /// Validates adaptive average pooling of an `[N, C, H, W]` input to `[H_out, W_out]`.
    pub fn new(input_shape: [usize; 4], output_size: [usize; 2]) -> Result<Self, KernelError> {
        const OP: &str = "adaptive_avg_pool2d";
        check_nonzero(OP, "output_size", output_size[0].min(output_size[1]))?;
        check_input_plane(OP, input_shape)?;
        let shape = PoolShape {
            batch: input_shape[0],
            channels: input_shape[1],
            input_size: [input_shape[2], input_shape[3]],
            output_size,
        };
        Ok(Self { shape })
    }
}
