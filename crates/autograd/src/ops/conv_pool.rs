//! `conv2d` and the 2-D poolings (`max_pool2d`, `avg_pool2d`, `adaptive_avg_pool2d`).
//!
//! Each op checks ranks and operand kinds here, lets kiln-device's geometry types validate the
//! parameters (their errors name the parameter and the fix), calls one seam method, and records
//! a node whose backward is the matching `*_backward` seam method. Max pooling saves the argmax
//! indices its forward returned; convolution saves input and weight and computes only the
//! gradients that are needed. Pooling accepts `[C, H, W]` too (PyTorch's unbatched form) by
//! adding and removing a batch dim of 1.

use crate::error::shape_err;
use crate::tensor::{fmt_shape, Tensor};
use crate::Result;
use kiln_device::ops::conv::{Conv2dGeometry, Conv2dParams};
use kiln_device::ops::pool::{
    AdaptiveAvgPool2dGeometry, AvgPool2dGeometry, AvgPool2dParams, MaxPool2dGeometry,
    MaxPool2dParams,
};
use kiln_device::prelude::*;
use kiln_device::{GradMask, Pool2d, Storage};

/// A gradient tensor over a fresh storage.
pub(crate) fn grad_tensor(storage: Storage, shape: &[usize]) -> Tensor {
    Tensor::from_storage(storage, shape, None)
}

/// `t`'s shape as `[N, C, H, W]`, or an error naming `what` and the expected layout.
fn dims4(op: &'static str, what: &str, layout: &str, t: &Tensor) -> Result<[usize; 4]> {
    t.shape().try_into().map_err(|_| {
        shape_err(
            op,
            format!("{what} {} must be 4-D {layout}", fmt_shape(t.shape())),
        )
    })
}

impl Tensor {
    /// 2-D convolution (PyTorch's `conv2d`): input `[N, C_in, H, W]`, weight
    /// `[C_out, C_in / groups, kH, kW]`, optional bias `[C_out]`.
    pub fn conv2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        params: Conv2dParams,
    ) -> Result<Tensor> {
        let _op = crate::autograd::attribution::forward_op("ConvolutionBackward");
        const OP: &str = "conv2d";
        self.check_float(OP)?;
        let mut operands = vec![self, weight];
        operands.extend(bias);
        if let Some(cast) = crate::autocast::lower_all(&operands)? {
            return cast[0].conv2d(&cast[1], cast.get(2), params);
        }
        self.check_same_kind(OP, weight)?;
        let input_shape = dims4(
            OP,
            "input",
            "[N, C_in, H, W]; add a batch dim with unsqueeze(0)",
            self,
        )?;
        let weight_shape = dims4(OP, "weight", "[C_out, C_in / groups, kH, kW]", weight)?;
        if let Some(b) = bias {
            self.check_same_kind(OP, b)?;
            if b.shape() != [weight_shape[0]] {
                return Err(shape_err(
                    OP,
                    format!(
                        "bias {} must be [{}] (one value per output channel of weight {})",
                        fmt_shape(b.shape()),
                        weight_shape[0],
                        fmt_shape(weight.shape())
                    ),
                ));
            }
        }
        let geometry = Conv2dGeometry::new(input_shape, weight_shape, params)
            .map_err(kiln_device::Error::from)?;
        let storage = {
            let (x, w) = (self.storage(), weight.storage());
            let b = bias.map(|b| b.storage());
            let bias_arg = b.as_deref().zip(bias.map(|t| t.layout()));
            x.conv2d(self.layout(), (&w, weight.layout()), bias_arg, &geometry)?
        };
        let out = Tensor::from_storage(storage, &geometry.output_shape(), None);
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        let node = Tensor::grad_node("ConvolutionBackward", &inputs, |needs| {
            let (x, w) = (self.saved(), weight.saved());
            let mask = GradMask {
                input: needs[0],
                weight: needs[1],
                bias: needs.get(2).copied().unwrap_or(false),
            };
            let with_bias = needs.len() == 3;
            Box::new(move |g| {
                let grads = {
                    let (gs, xs, ws) = (g.storage(), x.storage(), w.storage());
                    gs.conv2d_backward(
                        g.layout(),
                        (&xs, x.layout()),
                        (&ws, w.layout()),
                        &geometry,
                        mask,
                    )?
                };
                let shapes = [
                    geometry.input_shape().to_vec(),
                    geometry.weight_shape().to_vec(),
                    vec![geometry.out_channels],
                ];
                let mut out: Vec<Option<Tensor>> = grads
                    .into_array()
                    .into_iter()
                    .zip(shapes)
                    .map(|(s, shape)| s.map(|s| grad_tensor(s, &shape)))
                    .collect();
                out.truncate(if with_bias { 3 } else { 2 });
                Ok(out)
            })
        });
        Ok(Tensor::with_node(&out, node))
    }

    /// 2-D max pooling over `[N, C, H, W]` or `[C, H, W]`.
    ///
    /// Without a backward to follow (`no_grad`, or `self` needs no gradient) no indices are
    /// computed or kept.
    pub fn max_pool2d(&self, params: MaxPool2dParams) -> Result<Tensor> {
        let backward = crate::is_grad_enabled() && self.requires_grad();
        self.pool2d("max_pool2d", "MaxPool2DWithIndicesBackward", |shape| {
            let g = MaxPool2dGeometry::new(shape, params).map_err(kiln_device::Error::from)?;
            Ok(if backward {
                Pool2d::Max(g)
            } else {
                Pool2d::MaxValues(g)
            })
        })
    }

    /// 2-D average pooling over `[N, C, H, W]` or `[C, H, W]`.
    pub fn avg_pool2d(&self, params: AvgPool2dParams) -> Result<Tensor> {
        self.pool2d("avg_pool2d", "AvgPool2DBackward", |shape| {
            Ok(Pool2d::Avg(
                AvgPool2dGeometry::new(shape, params).map_err(kiln_device::Error::from)?,
            ))
        })
    }

    /// Adaptive average pooling of `[N, C, H, W]` or `[C, H, W]` to `output_size` `[H_out, W_out]`.
    pub fn adaptive_avg_pool2d(&self, output_size: [usize; 2]) -> Result<Tensor> {
        self.pool2d(
            "adaptive_avg_pool2d",
            "AdaptiveAvgPool2DBackward",
            |shape| {
                Ok(Pool2d::AdaptiveAvg(
                    AdaptiveAvgPool2dGeometry::new(shape, output_size)
                        .map_err(kiln_device::Error::from)?,
                ))
            },
        )
    }

    /// Pooling op `op` (its name in errors) recording node `name`.
    fn pool2d(
        &self,
        op: &'static str,
        name: &'static str,
        geometry: impl FnOnce([usize; 4]) -> Result<Pool2d>,
    ) -> Result<Tensor> {
        let _op = crate::autograd::attribution::forward_op(name);
        self.check_float(op)?;
        if self.rank() == 3 {
            return self
                .unsqueeze(0)?
                .pool2d(op, name, geometry)?
                .squeeze_dim(0);
        }
        let shape = dims4(op, "input", "[N, C, H, W] (or 3-D [C, H, W])", self)?;
        let pool = geometry(shape)?;
        let (storage, indices) = self.storage().pool2d(self.layout(), &pool)?;
        let out_shape = match &pool {
            Pool2d::Max(g) | Pool2d::MaxValues(g) => g.shape.output_shape(),
            Pool2d::Avg(g) => g.shape.output_shape(),
            Pool2d::AdaptiveAvg(g) => g.shape.output_shape(),
        };
        let out = Tensor::from_storage(storage, &out_shape, None);
        let indices = indices.map(|s| grad_tensor(s, &out_shape));
        let node = Tensor::grad_node(name, &[self], |_| {
            let input_shape = shape;
            Box::new(move |g| {
                let idx = indices.as_ref().map(|i| (i.storage(), i.layout()));
                let gi = g.storage().pool2d_backward(
                    g.layout(),
                    idx.as_ref().map(|(s, l)| (&**s, *l)),
                    &pool,
                )?;
                Ok(vec![Some(grad_tensor(gi, &input_shape))])
            })
        });
        Ok(Tensor::with_node(&out, node))
    }
}
