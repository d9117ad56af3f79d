//! `kl_div`: PyTorch's pointwise KL divergence `target · (log target - input)` with the input in
//! log space, composed from tensor ops.
//!
//! `target · log target` is PyTorch's `xlogy(target, target)`: 0 where the target is 0, NaN where
//! it is negative (not a probability) or NaN. It is computed as
//! `target · log(where(target == 0, 1, target))`, so neither the value nor the gradient sees
//! `log 0`.

use crate::targets::check_elementwise_target;
use crate::Result;
use kiln_autograd::Tensor;

/// `kl_div`'s `reduction`, which adds `'batchmean'` to the usual three.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KlDivReduction {
    /// Pointwise losses.
    None,
    /// Mean over every element (PyTorch's default, which it warns is not the KL divergence).
    #[default]
    Mean,
    /// Sum over every element.
    Sum,
    /// Sum divided by the batch size (dim 0): the mathematically correct KL divergence.
    BatchMean,
}

/// PyTorch's `kl_div(input, target, reduction, log_target)`: `input` holds log-probabilities;
/// `target` probabilities, or log-probabilities when `log_target`. Both get gradients.
pub fn kl_div(
    input: &Tensor,
    target: &Tensor,
    reduction: KlDivReduction,
    log_target: bool,
) -> Result<Tensor> {
    check_elementwise_target("kl_div", input, target)?;
    let pointwise = if log_target {
        target.exp()?.mul(&target.sub(input)?)?
    } else {
        let zero = target.eq_scalar(0.0)?;
        let safe = Tensor::where_(&zero, &target.ones_like()?, target)?;
        target.mul(&safe.log()?)?.sub(&target.mul(input)?)?
    };
    Ok(match reduction {
        KlDivReduction::None => pointwise,
        KlDivReduction::Mean => pointwise.mean_all()?,
        KlDivReduction::Sum => pointwise.sum_all()?,
        KlDivReduction::BatchMean => {
            let batch = input.shape().first().copied().unwrap_or(1);
            pointwise.sum_all()?.div_scalar(batch as f64)?
        }
    })
}
