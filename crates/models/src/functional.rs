//! The functional forms the layers call (PyTorch's `torch.nn.functional`), in one place so each
//! layer's forward reads like PyTorch's and the mapping onto `kiln-autograd`'s Tensor ops
//! (convolution, pooling, normalisation, embedding, dropout, all with backward) is written once.

use crate::error::config_err;
use crate::Result;
use kiln_autograd::{AvgPool2dParams, BatchNormOptions, Conv2dParams, MaxPool2dParams, Tensor};

/// 2-D convolution (`F.conv2d`).
pub fn conv2d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
) -> Result<Tensor> {
    let params = Conv2dParams {
        stride,
        padding,
        dilation,
        groups,
    };
    Ok(x.conv2d(weight, bias, params)?)
}

/// 2-D max pooling (`F.max_pool2d`, `ceil_mode = false`).
pub fn max_pool2d(
    x: &Tensor,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
) -> Result<Tensor> {
    let params = MaxPool2dParams {
        stride,
        padding,
        dilation,
        ..MaxPool2dParams::new(kernel)
    };
    Ok(x.max_pool2d(params)?)
}

/// 2-D average pooling (`F.avg_pool2d`, `count_include_pad = true`).
pub fn avg_pool2d(
    x: &Tensor,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
) -> Result<Tensor> {
    let params = AvgPool2dParams {
        stride,
        padding,
        ..AvgPool2dParams::new(kernel)
    };
    Ok(x.avg_pool2d(params)?)
}

/// Adaptive average pooling to `output_size` (`F.adaptive_avg_pool2d`).
pub fn adaptive_avg_pool2d(x: &Tensor, output_size: [usize; 2]) -> Result<Tensor> {
    Ok(x.adaptive_avg_pool2d(output_size)?)
}

/// Batch normalisation (`F.batch_norm`): in training, normalises with batch statistics and
/// updates `running_mean`/`running_var` in place with `momentum`.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm(
    x: &Tensor,
    running_mean: &Tensor,
    running_var: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    training: bool,
    momentum: f64,
    eps: f64,
) -> Result<Tensor> {
    let options = BatchNormOptions {
        training,
        momentum,
        eps,
    };
    Ok(x.batch_norm(Some(running_mean), Some(running_var), weight, bias, options)?)
}

/// Layer normalisation over the trailing `normalized_shape` dims (`F.layer_norm`).
pub fn layer_norm(
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    Ok(x.layer_norm(normalized_shape, weight, bias, eps)?)
}

/// Rows of `weight` picked by integer `indices` (`F.embedding`).
pub fn embedding(indices: &Tensor, weight: &Tensor) -> Result<Tensor> {
    Ok(Tensor::embedding(indices, weight, None)?)
}

/// Checks a dropout probability: `p` in `[0, 1)`.
pub fn check_dropout(what: &'static str, p: f64) -> Result<f64> {
    if !(0.0..1.0).contains(&p) {
        return Err(config_err(
            what,
            format!("dropout p = {p:?} must be in [0, 1); use 0 to drop nothing"),
        ));
    }
    Ok(p)
}

/// Dropout (`F.dropout`): in training, zeroes each element with probability `p` (mask from
/// kiln's default generator) and scales the rest by `1 / (1 - p)`; otherwise returns `x`.
pub fn dropout(x: &Tensor, p: f64, training: bool) -> Result<Tensor> {
    Ok(x.dropout(p, training)?)
}
