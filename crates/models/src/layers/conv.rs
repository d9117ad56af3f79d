//! `Conv2d` over `[N, C, H, W]` inputs.

use crate::error::{config_err, input_err};
use crate::functional;
use crate::init;
use crate::layer::any_trainable;
use crate::trace::{Act, Tracer};
use crate::{layer_casts, module_tree, Layer, Result};
use kiln_autograd::{Module, Parameter, Tensor};
use kiln_device::ops::conv::{Conv2dGeometry, Conv2dParams};
use kiln_device::ops::KernelError;

/// Options of a [`Conv2d`] beyond channels and kernel size (PyTorch's defaults: stride 1,
/// padding 0, dilation 1, groups 1, with bias).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2dConfig {
    /// Step of the kernel, `[h, w]`.
    pub stride: [usize; 2],
    /// Zero padding on each side, `[h, w]`.
    pub padding: [usize; 2],
    /// Spacing of kernel taps, `[h, w]`.
    pub dilation: [usize; 2],
    /// Channel groups (`in` and `out` must both divide by it).
    pub groups: usize,
    /// Whether the layer has a bias.
    pub bias: bool,
}

impl Default for Conv2dConfig {
    fn default() -> Self {
        Conv2dConfig {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
            bias: true,
        }
    }
}

impl Conv2dConfig {
    /// Same stride on both axes.
    pub fn stride(mut self, s: usize) -> Self {
        self.stride = [s, s];
        self
    }

    /// Same padding on both axes.
    pub fn padding(mut self, p: usize) -> Self {
        self.padding = [p, p];
        self
    }

    /// Without a bias (the convolutions before a BatchNorm).
    pub fn no_bias(mut self) -> Self {
        self.bias = false;
        self
    }
}

/// A 2-D convolution (`torch.nn.Conv2d`): `weight` `[out, in / groups, kh, kw]`, optional
/// `bias` `[out]`.
#[derive(Debug)]
pub struct Conv2d {
    /// `[out_channels, in_channels / groups, kh, kw]`.
    pub weight: Parameter,
    /// `[out_channels]`, if the layer has a bias.
    pub bias: Option<Parameter>,
    /// Stride, padding, dilation, groups.
    pub config: Conv2dConfig,
    training: bool,
}

impl Conv2d {
    /// A square-kernel convolution with PyTorch's default init.
    pub fn new(in_ch: usize, out_ch: usize, kernel: usize, config: Conv2dConfig) -> Result<Self> {
        let g = config.groups;
        if in_ch == 0
            || out_ch == 0
            || kernel == 0
            || g == 0
            || !in_ch.is_multiple_of(g)
            || !out_ch.is_multiple_of(g)
        {
            return Err(config_err(
                "Conv2d",
                format!(
                    "in_channels {in_ch}, out_channels {out_ch} and kernel {kernel} must be positive \
                     and both channel counts divisible by groups {g}"
                ),
            ));
        }
        if config.stride.contains(&0) || config.dilation.contains(&0) {
            return Err(config_err(
                "Conv2d",
                format!(
                    "stride {:?} and dilation {:?} must be positive",
                    config.stride, config.dilation
                ),
            ));
        }
        let shape = [out_ch, in_ch / g, kernel, kernel];
        let weight = init::kaiming_uniform_a_sqrt5(&shape)?;
        let bias = if config.bias {
            let (fan_in, _) = init::fans(&shape);
            Some(init::uniform(&[out_ch], 1.0 / (fan_in as f64).sqrt())?)
        } else {
            None
        };
        Ok(Conv2d {
            weight,
            bias,
            config,
            training: true,
        })
    }

    /// A convolution with the given weight `[out, in / groups, kh, kw]` (square kernel) and
    /// bias, e.g. for models with their own init.
    pub fn from_parts(
        weight: Parameter,
        bias: Option<Parameter>,
        config: Conv2dConfig,
    ) -> Result<Self> {
        let w = weight.shape();
        if w.len() != 4 || w[2] != w[3] || bias.as_ref().is_some_and(|b| b.shape() != [w[0]]) {
            return Err(config_err(
                "Conv2d",
                format!(
                    "weight {w:?} must be [out, in / groups, k, k] and the bias [out], got bias {:?}",
                    bias.as_ref().map(|b| b.shape().to_vec())
                ),
            ));
        }
        let has_bias = bias.is_some();
        Ok(Conv2d {
            weight,
            bias,
            config: Conv2dConfig {
                bias: has_bias,
                ..config
            },
            training: true,
        })
    }

    /// Reports the CUDA kernels' scratch for this call to `tracer` (the CPU's depends on the
    /// thread count and is not modelled).
    fn trace_cuda_workspace(&self, tracer: &mut Tracer, x: &Act, out: &Act) -> Result<()> {
        let geometry = |shape: &[usize]| -> Option<[usize; 4]> { shape.try_into().ok() };
        let (Some(xs), Some(ws)) = (geometry(x.shape()), geometry(self.weight.shape())) else {
            return Ok(());
        };
        let workspace = Conv2dGeometry::new(xs, ws, self.params())
            .map_err(kiln_device::Error::from)
            .and_then(|g| {
                let mask = kiln_device::GradMask {
                    input: x.requires_grad(),
                    weight: self.weight.requires_grad(),
                    bias: self.bias.as_ref().is_some_and(|b| b.requires_grad()),
                };
                kiln_device::ops::conv::cuda_conv2d_workspace(&g, x.dtype(), mask)
            })
            .map_err(|e| input_err("Conv2d", format!("input {xs:?}: {e}")))?;
        let backward: &[i64] = if out.requires_grad() {
            &workspace.backward
        } else {
            &[]
        };
        tracer.kernel_scratch(workspace.forward, backward, workspace.batch_limit);
        Ok(())
    }

    /// The device's convolution parameters for this layer's settings.
    fn params(&self) -> Conv2dParams {
        let c = &self.config;
        Conv2dParams {
            stride: c.stride,
            padding: c.padding,
            dilation: c.dilation,
            groups: c.groups,
        }
    }

    /// Output shape for an input shape, or a message naming the mismatch. The sizes are kiln-
    /// device's (`Conv2dGeometry`, the one validation every convolution goes through), so a
    /// shape traced here is the shape the forward makes or refuses.
    pub fn output_shape(&self, x: &[usize]) -> Result<Vec<usize>> {
        let w = self.weight.shape();
        let in_ch = w[1] * self.config.groups;
        let shapes = <[usize; 4]>::try_from(x)
            .ok()
            .filter(|xs| xs[1] == in_ch)
            .zip(<[usize; 4]>::try_from(w).ok());
        let Some((xs, ws)) = shapes else {
            return Err(input_err(
                "Conv2d",
                format!("expected a [N, {in_ch}, H, W] input, got {x:?}"),
            ));
        };
        match Conv2dGeometry::new(xs, ws, self.params()) {
            Ok(g) => Ok(g.output_shape().to_vec()),
            Err(KernelError::WindowLargerThanInput { window, .. }) => Err(input_err(
                "Conv2d",
                format!(
                    "input {x:?} with padding {:?} is smaller than the dilated kernel ({window}); \
                     use a larger input or more padding",
                    self.config.padding
                ),
            )),
            Err(e) => Err(input_err("Conv2d", format!("input {x:?}: {e}"))),
        }
    }
}

impl Module for Conv2d {
    fn own_parameters(&self) -> Vec<(String, Parameter)> {
        let mut out = vec![("weight".to_string(), self.weight.clone())];
        if let Some(b) = &self.bias {
            out.push(("bias".to_string(), b.clone()));
        }
        out
    }
    module_tree!();
}

impl Layer for Conv2d {
    fn type_name(&self) -> &'static str {
        "Conv2d"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.output_shape(x.shape())?;
        let c = &self.config;
        functional::conv2d(
            x,
            &self.weight,
            self.bias.as_ref().map(|b| b.tensor()),
            c.stride,
            c.padding,
            c.dilation,
            c.groups,
        )
    }

    fn trace(&self, tracer: &mut Tracer, x: &Act) -> Result<Act> {
        let shape = self.output_shape(x.shape())?;
        let trainable = any_trainable(std::iter::once(&self.weight).chain(&self.bias));
        let out = tracer.output(&[x], &shape, x.dtype(), trainable);
        if out.requires_grad() {
            // kiln's backward keeps the input whenever the op is recorded.
            tracer.save(x);
        }
        if tracer.device().is_some_and(|d| d.is_cuda()) {
            self.trace_cuda_workspace(tracer, x, &out)?;
        }
        Ok(out)
    }

    layer_casts!();
}
