//! Single-image inference: what the `predict` example runs. A checkpoint whose class list does
//! not fit its model is refused when read, and non-finite probabilities are an error, never a
//! printed `NaN%`.

use super::checkpoint;
use super::error::{Error, Result};
use kiln_autograd::{no_grad, Device, Tensor};
use kiln_models::models::ResNet;
use kiln_models::Layer;

/// One image `[C, H, W]` -> top-`k` `(class index, probability)`, under `no_grad` (the model
/// should be in eval mode): what `predict` prints. The ranking is the `topk` op on the model's
/// device (no host sort; equal probabilities in class order), and only the `k` winners are
/// copied to the host. `k` past the number of classes is cut to it.
pub fn top_k(model: &ResNet, image: &Tensor, k: usize) -> Result<Vec<(usize, f64)>> {
    no_grad(|| -> Result<Vec<(usize, f64)>> {
        let logits = model.forward(&image.unsqueeze(0)?)?.squeeze_dim(0)?;
        let probs = logits.softmax(0)?;
        let k = k.min(probs.shape()[0]);
        let (values, indices) = probs.topk(k, 0, true, true)?;
        let values = values.to_vec_f64()?;
        let indices = indices.to_vec::<i64>()?;
        Ok(indices
            .into_iter()
            .zip(values)
            .map(|(i, p)| (i as usize, p))
            .collect())
    })
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
