//! 2-D convolution (`conv2d`): parameters, shape validation, and the kernels.
//!
//! Layouts are PyTorch's, contiguous and row-major: input `[N, C_in, H, W]`, weight
//! `[C_out, C_in / groups, kH, kW]`, bias `[C_out]`, output `[N, C_out, H_out, W_out]` with
//! `H_out = (H + 2 * pad_h - dil_h * (kH - 1) - 1) / stride_h + 1` (likewise for the width).
//!
//! A call first builds a [`Conv2dGeometry`] from the input and weight shapes and the
//! [`Conv2dParams`]; that constructor is where every parameter rule is checked (zero stride,
//! channel counts not divisible by `groups`, a dilated kernel that does not fit into the padded
//! input, ...). The kernels in [`cpu`] then only check that each slice has its shape's length.
//! The CUDA implementation ([`cuda`]: im2col/col2im kernels around cuBLAS GEMMs) sits beside
//! `cpu.rs` and takes the same geometry.

pub mod cpu;
mod cpu_chunked;
mod cpu_chunked_weight;
mod cpu_direct;
mod cpu_gemm;
mod cpu_input_grad;
mod cpu_rows;
mod cpu_weight_taps;
#[cfg(feature = "cuda")]
pub mod cuda;
mod padded;
mod pieces;
pub mod reference;
mod subsample;
mod workspace;

pub use cpu_weight_taps::{weight_grad_path, WeightGradPath};
pub use workspace::{
    cuda_conv2d_workspace, cuda_conv_column_budget, cuda_conv_images_per_chunk,
    set_cuda_conv_column_budget, ConvWorkspace, DEFAULT_CUDA_CONV_COLUMN_BUDGET,
};

use super::kernel_error::{check_nonzero, KernelError};
use crate::ops::buffer::BufferOps;
use crate::seam::{pass_through, seam_trait, GradMask, InputGrads, Strided};
use crate::{Layout, Result};

pass_through!(ref Conv2dGeometry);

seam_trait! {
    /// 2-D convolution (input shapes validated by the caller; the geometry checks the
    /// parameters).
    pub trait ConvOps: BufferOps {
        /// `conv2d`: `self` is the input `[N, C_in, H, W]`, `weight`
        /// `[C_out, C_in/groups, kH, kW]`, `bias` `[C_out]`; output `[N, C_out, H_out, W_out]`.
        fn conv2d(
            &self,
            layout: &Layout,
            weight: Strided<'_, Self>,
            bias: Option<Strided<'_, Self>>,
            geometry: &Conv2dGeometry,
        ) -> Result<Self>;
        /// Gradients of `conv2d` from `self` = the output gradient; only those `mask` asks for.
        fn conv2d_backward(
            &self,
            layout: &Layout,
            input: Strided<'_, Self>,
            weight: Strided<'_, Self>,
            geometry: &Conv2dGeometry,
            mask: GradMask,
        ) -> Result<InputGrads<Self>>;
    }
}

/// Stride, padding, dilation and groups of a 2-D convolution, as `[height, width]` pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2dParams {
    /// Step between neighbouring windows.
    pub stride: [usize; 2],
    /// Implicit zeros added on both sides of each spatial axis.
    pub padding: [usize; 2],
    /// Spacing between kernel taps.
    pub dilation: [usize; 2],
    /// Number of independent channel groups (`in_channels` and `out_channels` divide by it).
    pub groups: usize,
}

impl Default for Conv2dParams {
    /// PyTorch's defaults: stride 1, padding 0, dilation 1, groups 1.
    fn default() -> Self {
        Self {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        }
    }
}

/// The validated sizes of one convolution: what every conv kernel takes.
///
/// Build it with [`Conv2dGeometry::new`]; its fields are public to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Conv2dGeometry {
    /// Batch size `N`.
    pub batch: usize,
    /// Input channels `C_in`.
    pub in_channels: usize,
    /// Output channels `C_out`.
    pub out_channels: usize,
    /// Input `[H, W]`.
    pub input_size: [usize; 2],
    /// Kernel `[kH, kW]`.
    pub kernel_size: [usize; 2],
    /// Output `[H_out, W_out]`.
    pub output_size: [usize; 2],
    /// Stride, padding, dilation, groups.
    pub params: Conv2dParams,
}

const AXES: [&str; 2] = ["height", "width"];

impl Conv2dGeometry {
    /// Validates a convolution of an input of shape `[N, C_in, H, W]` with a weight of shape
    /// `[C_out, C_in / groups, kH, kW]`, and computes the output size.
    pub fn new(
        input_shape: [usize; 4],
        weight_shape: [usize; 4],
        params: Conv2dParams,
    ) -> Result<Self, KernelError> {
        const OP: &str = "conv2d";
        let [batch, in_channels, in_h, in_w] = input_shape;
        let [out_channels, weight_in, k_h, k_w] = weight_shape;
        check_nonzero(OP, "stride", params.stride[0].min(params.stride[1]))?;
        check_nonzero(OP, "dilation", params.dilation[0].min(params.dilation[1]))?;
        check_nonzero(OP, "groups", params.groups)?;
        check_nonzero(OP, "kernel_size", k_h.min(k_w))?;
        for (channels_name, channels) in
            [("in_channels", in_channels), ("out_channels", out_channels)]
        {
            if channels % params.groups != 0 {
                return Err(KernelError::NotDivisibleByGroups {
                    op: OP,
                    channels_name,
                    channels,
                    groups: params.groups,
                });
            }
        }
        let expected = in_channels / params.groups;
        if weight_in != expected {
            return Err(KernelError::WeightChannelMismatch {
                op: OP,
                weight_shape,
                in_channels,
                groups: params.groups,
                expected,
            });
        }
        if in_h == 0 || in_w == 0 {
            return Err(KernelError::InvalidShape {
                op: OP,
                shape: input_shape.to_vec(),
                rule: "an input plane is empty (height or width 0), so there is nothing to \
                       convolve; pass images of at least one pixel (an empty batch, N = 0, is \
                       allowed)"
                    .into(),
            });
        }
        let mut output_size = [0; 2];
        for axis in 0..2 {
            let window = params.dilation[axis]
                .checked_mul([k_h, k_w][axis] - 1)
                .and_then(|w| w.checked_add(1));
            let padded_input = params.padding[axis]
                .checked_mul(2)
                .and_then(|p| p.checked_add([in_h, in_w][axis]));
            let (Some(window), Some(padded_input)) = (window, padded_input) else {
                return Err(KernelError::InvalidShape {
                    op: OP,
                    shape: input_shape.to_vec(),
                    rule: format!(
                        "padding {:?} or dilation {:?} of a {k_h}x{k_w} kernel makes a size past \
                         usize::MAX; use the padding and dilation the model means",
                        params.padding, params.dilation
                    ),
                });
            };
            if window > padded_input {
                return Err(KernelError::WindowLargerThanInput {
                    op: OP,
                    axis: AXES[axis],
                    window,
                    padded_input,
                });
            }
            output_size[axis] = (padded_input - window) / params.stride[axis] + 1;
        }
        Ok(Self {
            batch,
            in_channels,
            out_channels,
            input_size: [in_h, in_w],
            kernel_size: [k_h, k_w],
            output_size,
            params,
        })
    }

    /// `[N, C_in, H, W]`.
    pub fn input_shape(&self) -> [usize; 4] {
        [
            self.batch,
            self.in_channels,
            self.input_size[0],
            self.input_size[1],
        ]
    }

    /// `[C_out, C_in / groups, kH, kW]`.
    pub fn weight_shape(&self) -> [usize; 4] {
        [
            self.out_channels,
            self.in_channels / self.params.groups,
            self.kernel_size[0],
            self.kernel_size[1],
        ]
    }

    /// `[N, C_out, H_out, W_out]`.
    pub fn output_shape(&self) -> [usize; 4] {
        [
            self.batch,
            self.out_channels,
            self.output_size[0],
            self.output_size[1],
        ]
    }

    /// Multiply-accumulates of the forward pass (each of the two backward passes does as many).
    pub fn forward_macs(&self) -> usize {
        self.output_shape().iter().product::<usize>()
            * (self.in_channels / self.params.groups)
            * self.kernel_size[0]
            * self.kernel_size[1]
    }

    /// Rows of one group's im2col matrix: `C_in / groups * kH * kW`.
    fn col_rows(&self) -> usize {
        self.in_channels / self.params.groups * self.kernel_size[0] * self.kernel_size[1]
    }

    /// Columns of the im2col matrix: `H_out * W_out`.
    fn col_cols(&self) -> usize {
        self.output_size[0] * self.output_size[1]
    }

    /// True when im2col is the identity (1x1 kernel, stride 1, no padding): the input plane
    /// block is already the column matrix.
    fn is_pointwise(&self) -> bool {
        self.kernel_size == [1, 1] && self.params.stride == [1, 1] && self.params.padding == [0, 0]
    }

    /// A 1x1 kernel without padding at a stride above 1 (ResNet's downsampling shortcuts): its
    /// column matrix is the input subsampled at the stride.
    fn is_subsampling(&self) -> bool {
        self.kernel_size == [1, 1] && self.params.padding == [0, 0] && self.params.stride != [1, 1]
    }
}
