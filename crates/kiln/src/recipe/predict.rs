//! Single-image inference: what the `predict` example runs. A checkpoint whose class list does
//! not fit its model is refused when read, and non-finite probabilities are an error, never a
//! printed `NaN%`.

use super::checkpoint;
use super::error::{Error, Result};
use kiln_autograd::{no_grad, Device, Tensor};
use kiln_models::models::ResNet;
use kiln_models::Layer;

/// One image `[C, H, W]` -> top-`k` `(class index, probability)`, under
/// `no_grad` (the model should be in eval mode): what `predict` prints.
pub fn top_k(model: &ResNet, image: &Tensor, k: usize) -> Result<Vec<(usize, f64)>> {
    let probs = no_grad(|| -> Result<Vec<f64>> {
        let logits = model.forward(&image.unsqueeze(0)?)?.squeeze_dim(0)?;
        Ok(logits.softmax(0)?.to_vec_f64()?)
    })?;
    let mut ranked: Vec<(usize, f64)> = probs.into_iter().enumerate().collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked.truncate(k);
    Ok(ranked)
}

/// Single-image inference, as the `predict` example runs it: rebuilds the model a checkpoint
/// describes, reads the PNG/JPEG at `image` (HWC -> CHW, normalised with the checkpoint's
/// constants; a wrong size or channel count is kiln-data's error naming both, unless `options`
/// allow the fix) and returns the top-`k` `(class name, probability)` pairs.
pub fn predict(
    checkpoint: &std::path::Path,
    image: &std::path::Path,
    options: kiln_data::ImageOptions,
    k: usize,
) -> Result<Vec<(String, f64)>> {
    let (model, info) = checkpoint::load_model(checkpoint)?;
    let x = kiln_data::load_image(
        image,
        info.config.input_shape(),
        options,
        Some(&info.normalize),
        Device::Cpu,
    )?;
    let ranked = top_k(&model, &x, k)?;
    if ranked.iter().any(|(_, p)| !p.is_finite()) {
        return Err(Error::Checkpoint(format!(
            "{}: the model's class probabilities are NaN, so its weights hold NaN or infinite \
             values (training diverged, or the file was damaged); predict with an earlier \
             checkpoint, or retrain with a lower learning rate",
            checkpoint.display()
        )));
    }
    Ok(ranked
        .into_iter()
        .map(|(i, p)| (info.classes[i].clone(), p))
        .collect())
}
