//! Pooling layers over `[N, C, H, W]`: `MaxPool2d`, `AvgPool2d`, `AdaptiveAvgPool2d`
//! (`ceil_mode = false`, as PyTorch's default).

use crate::error::{config_err, input_err};
use crate::functional;
use crate::trace::{Act, Tracer};
use crate::{layer_casts, module_tree, Layer, Result};
use kiln_autograd::{DType, Module, Tensor};

/// Output size of a sliding window along one axis, or `None` when the window does not fit.
fn window_out(size: usize, kernel: usize, stride: usize, pad: usize, dil: usize) -> Option<usize> {
    let span = dil * (kernel - 1) + 1;
    (size + 2 * pad)
        .checked_sub(span)
        .map(|room| room / stride + 1)
}

fn check_window(layer: &'static str, kernel: usize, stride: usize, padding: usize) -> Result<()> {
    if kernel == 0 || stride == 0 || padding > kernel / 2 {
        return Err(config_err(
            layer,
            format!(
                "kernel {kernel} and stride {stride} must be positive and padding {padding} at most \
                 half the kernel"
            ),
        ));
    }
    Ok(())
}

fn pooled_shape(
    layer: &'static str,
    x: &[usize],
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
) -> Result<Vec<usize>> {
    let bad = || {
        input_err(
            layer,
            format!("expected an [N, C, H, W] input with H, W >= the kernel ({kernel}), got {x:?}"),
        )
    };
    if x.len() != 4 {
        return Err(bad());
    }
    let h = window_out(x[2], kernel, stride, padding, dilation).ok_or_else(bad)?;
    let w = window_out(x[3], kernel, stride, padding, dilation).ok_or_else(bad)?;
    Ok(vec![x[0], x[1], h, w])
}

/// Max pooling with a square window (`torch.nn.MaxPool2d`).
#[derive(Debug)]
pub struct MaxPool2d {
    /// Window size.
    pub kernel_size: usize,
    /// Step (PyTorch defaults it to the kernel size).
    pub stride: usize,
    /// Implicit `-inf` padding on each side.
    pub padding: usize,
    training: bool,
}

impl MaxPool2d {
    /// `MaxPool2d(kernel_size, stride, padding)`.
    pub fn new(kernel_size: usize, stride: usize, padding: usize) -> Result<Self> {
        check_window("MaxPool2d", kernel_size, stride, padding)?;
        Ok(MaxPool2d {
            kernel_size,
            stride,
            padding,
            training: true,
        })
    }
}

impl Module for MaxPool2d {
    module_tree!();
}

impl Layer for MaxPool2d {
    fn type_name(&self) -> &'static str {
        "MaxPool2d"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        pooled_shape(
            "MaxPool2d",
            x.shape(),
            self.kernel_size,
            self.stride,
            self.padding,
            1,
        )?;
        let (k, s, p) = (self.kernel_size, self.stride, self.padding);
        functional::max_pool2d(x, [k, k], [s, s], [p, p], [1, 1])
    }
    fn trace(&self, tracer: &mut Tracer, x: &Act) -> Result<Act> {
        let shape = pooled_shape(
            "MaxPool2d",
            x.shape(),
            self.kernel_size,
            self.stride,
            self.padding,
            1,
        )?;
        // Backward routes gradients through the argmax indices.
        if x.requires_grad() {
            tracer.save_new(&shape, DType::I64);
        }
        Ok(tracer.output(&[x], &shape, x.dtype(), false))
    }
    layer_casts!();
}

/// Average pooling with a square window, padding counted in the divisor
/// (`torch.nn.AvgPool2d`, `count_include_pad = true`).
#[derive(Debug)]
pub struct AvgPool2d {
    /// Window size.
    pub kernel_size: usize,
    /// Step.
    pub stride: usize,
    /// Zero padding on each side.
    pub padding: usize,
    training: bool,
}

impl AvgPool2d {
    /// `AvgPool2d(kernel_size, stride, padding)`.
    pub fn new(kernel_size: usize, stride: usize, padding: usize) -> Result<Self> {
        check_window("AvgPool2d", kernel_size, stride, padding)?;
        Ok(AvgPool2d {
            kernel_size,
            stride,
            padding,
            training: true,
        })
    }
}

impl Module for AvgPool2d {
    module_tree!();
}

impl Layer for AvgPool2d {
    fn type_name(&self) -> &'static str {
        "AvgPool2d"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (k, s, p) = (self.kernel_size, self.stride, self.padding);
        pooled_shape("AvgPool2d", x.shape(), k, s, p, 1)?;
        functional::avg_pool2d(x, [k, k], [s, s], [p, p])
    }
    fn trace(&self, tracer: &mut Tracer, x: &Act) -> Result<Act> {
        let (k, s, p) = (self.kernel_size, self.stride, self.padding);
        let shape = pooled_shape("AvgPool2d", x.shape(), k, s, p, 1)?;
        Ok(tracer.output(&[x], &shape, x.dtype(), false))
    }
    layer_casts!();
}

/// Average pooling to a fixed output size (`torch.nn.AdaptiveAvgPool2d`).
#[derive(Debug)]
pub struct AdaptiveAvgPool2d {
    /// `[h, w]` of the output.
    pub output_size: [usize; 2],
    training: bool,
}

impl AdaptiveAvgPool2d {
    /// `AdaptiveAvgPool2d((h, w))`.
    pub fn new(output_size: [usize; 2]) -> Result<Self> {
        if output_size.contains(&0) {
            return Err(config_err(
                "AdaptiveAvgPool2d",
                format!("output size {output_size:?} must be positive"),
            ));
        }
        Ok(AdaptiveAvgPool2d {
            output_size,
            training: true,
        })
    }

    fn shape(&self, x: &[usize]) -> Result<Vec<usize>> {
        if x.len() != 4 || x[2] == 0 || x[3] == 0 {
            return Err(input_err(
                "AdaptiveAvgPool2d",
                format!("expected a non-empty [N, C, H, W] input, got {x:?}"),
            ));
        }
        Ok(vec![x[0], x[1], self.output_size[0], self.output_size[1]])
    }
}

impl Module for AdaptiveAvgPool2d {
    module_tree!();
}

impl Layer for AdaptiveAvgPool2d {
    fn type_name(&self) -> &'static str {
        "AdaptiveAvgPool2d"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.shape(x.shape())?;
        functional::adaptive_avg_pool2d(x, self.output_size)
    }
    fn trace(&self, tracer: &mut Tracer, x: &Act) -> Result<Act> {
        let shape = self.shape(x.shape())?;
        Ok(tracer.output(&[x], &shape, x.dtype(), false))
    }
    layer_casts!();
}
