//! The Tensor ops the layers call that live outside `kiln-autograd`'s first op set
//! (convolution, pooling, normalisation, embedding lookup), in one place so each layer's
//! forward reads like PyTorch's functional calls.

use crate::error::config_err;
use crate::Result;
use kiln_autograd::Tensor;

fn pending(op: &'static str) -> crate::Error {
    config_err(
        "kiln-models forward",
        format!(
            "{op} needs the conv/pool/norm/embedding Tensor ops with backward, which this build of \
             kiln-autograd does not have yet; use summary/trace (shape-only) meanwhile"
        ),
    )
}

/// 2-D convolution (`F.conv2d`).
#[allow(clippy::too_many_arguments)]
pub fn conv2d(
    _x: &Tensor,
    _weight: &Tensor,
    _bias: Option<&Tensor>,
    _stride: [usize; 2],
    _padding: [usize; 2],
    _dilation: [usize; 2],
    _groups: usize,
) -> Result<Tensor> {
    Err(pending("conv2d"))
}

/// 2-D max pooling (`F.max_pool2d`, `ceil_mode = false`).
pub fn max_pool2d(
    _x: &Tensor,
    _kernel: [usize; 2],
    _stride: [usize; 2],
    _padding: [usize; 2],
    _dilation: [usize; 2],
) -> Result<Tensor> {
    Err(pending("max_pool2d"))
}

/// 2-D average pooling (`F.avg_pool2d`, `count_include_pad = true`).
pub fn avg_pool2d(
    _x: &Tensor,
    _kernel: [usize; 2],
    _stride: [usize; 2],
    _padding: [usize; 2],
) -> Result<Tensor> {
    Err(pending("avg_pool2d"))
}

/// Adaptive average pooling to `output_size` (`F.adaptive_avg_pool2d`).
pub fn adaptive_avg_pool2d(_x: &Tensor, _output_size: [usize; 2]) -> Result<Tensor> {
    Err(pending("adaptive_avg_pool2d"))
}

/// Batch normalisation (`F.batch_norm`): in training, normalises with batch statistics and
/// updates `running_mean`/`running_var` in place with `momentum`.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm(
    _x: &Tensor,
    _running_mean: &Tensor,
    _running_var: &Tensor,
    _weight: Option<&Tensor>,
    _bias: Option<&Tensor>,
    _training: bool,
    _momentum: f64,
    _eps: f64,
) -> Result<Tensor> {
    Err(pending("batch_norm"))
}

/// Layer normalisation over the trailing `normalized_shape` dims (`F.layer_norm`).
pub fn layer_norm(
    _x: &Tensor,
    _normalized_shape: &[usize],
    _weight: Option<&Tensor>,
    _bias: Option<&Tensor>,
    _eps: f64,
) -> Result<Tensor> {
    Err(pending("layer_norm"))
}

/// Rows of `weight` picked by integer `indices` (`F.embedding`).
pub fn embedding(_indices: &Tensor, _weight: &Tensor) -> Result<Tensor> {
    Err(pending("embedding"))
}

/// Checks a dropout probability: `p` in `[0, 1)`.
pub fn check_dropout(what: &'static str, p: f64) -> Result<f64> {
    if !(0.0..1.0).contains(&p) {
        return Err(config_err(
            what,
            format!("dropout p = {p} must be in [0, 1); use 0 to drop nothing"),
        ));
    }
    Ok(p)
}

/// Dropout (`F.dropout`): in training, zeroes each element with probability `p` (mask from
/// kiln's default generator) and scales the rest by `1 / (1 - p)`; otherwise returns `x`.
pub fn dropout(x: &Tensor, p: f64, training: bool) -> Result<Tensor> {
    if !training || p == 0.0 {
        return Ok(x.clone());
    }
    let keep = Tensor::rand(x.shape(), x.dtype(), x.device())?.ge_scalar(p)?;
    let scale = keep.to_dtype(x.dtype())?.mul_scalar(1.0 / (1.0 - p))?;
    Ok(x.mul(&scale)?)
}
