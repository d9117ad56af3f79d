//! The `train` group's small-Transformer case: a character-level GPT of nanoGPT's CPU size
//! (vocabulary 65, 64 positions, 4 pre-norm causal blocks of width 128 with 4 heads,
//! tanh-GELU), a training step at batch 12 (quick: 4) with AdamW and `clip_grad_norm_(1.0)`.
//! Its matrices are small (at most `[768, 512]` at batch 12), so attention's masking and
//! softmax, the GELUs, the norms and each op's own cost weigh more than in the ResNet cases.
//! With `--vs-torch` the step gets a row against PyTorch's same model (`torch_bench.py`'s
//! `gpt_step`: `nn.TransformerEncoderLayer` blocks with the same options, in a PyTorch process
//! of its own). A file apart from `train.rs`, whose helpers it uses; `mod.rs` runs it in the
//! `train` group.

use super::harness::{err, median_of, Options, Row};
use super::torch::{Figure, Pairs};
use super::train::{fresh_start, GROUP};
use kiln_autograd::{Device, Module, Tensor};
use kiln_losses::{cross_entropy, CrossEntropyOptions};
use kiln_models::models::{Gpt, GptConfig};
use kiln_models::Layer;
use kiln_optim::{AdamOptions, AdamW, Optimizer, ParamGroup};

const CPU: Device = Device::Cpu;

/// nanoGPT's character-level model for a CPU (its `shakespeare_char` sizes for a laptop).
pub(super) const CONFIG: GptConfig = GptConfig {
    vocab_size: 65,
    block_size: 64,
    n_layer: 4,
    n_head: 4,
    n_embd: 128,
    dropout: 0.0,
};

/// Token ids `[batch, block_size]` and their next-token targets `[batch * block_size]`: a fixed
/// pattern, the same in `torch_bench.py`.
pub(super) fn tokens(batch: usize) -> Result<(Tensor, Tensor), String> {
    let (t, v) = (CONFIG.block_size, CONFIG.vocab_size);
    let ids: Vec<i64> = (0..batch * t).map(|i| ((i * 7919) % v) as i64).collect();
    let next: Vec<i64> = ids.iter().map(|&i| (i + 1) % v as i64).collect();
    let x = Tensor::from_vec(ids, &[batch, t], CPU).map_err(err)?;
    let y = Tensor::from_vec(next, &[batch * t], CPU).map_err(err)?;
    Ok((x, y))
}

/// The `train` group's GPT rows (see the module doc).
pub(super) fn run(options: &Options) -> Result<Vec<Row>, String> {
    if options.gpu_only {
        return Ok(Vec::new());
    }
    let (batch, steps) = if options.quick { (4, 3) } else { (12, 20) };
    fresh_start()?;
    let model = Gpt::new(CONFIG).map_err(err)?;
    let params = model.named_parameters();
    let mut opt = AdamW::new(
        vec![ParamGroup::from_module(&model)],
        AdamOptions::adamw().lr(1e-3),
    )
    .map_err(err)?;
    let (x, y) = tokens(batch)?;
    let ce = CrossEntropyOptions::default();
    let classes = CONFIG.vocab_size as isize;
    let mut step = || {
        let logits = model.forward(&x).map_err(err)?;
        let logits = logits.reshape(&[-1, classes]).map_err(err)?;
        cross_entropy(&logits, &y, &ce)
            .map_err(err)?
            .backward()
            .map_err(err)?;
        kiln_optim::clip_grad_norm_(&params, 1.0, 2.0, false).map_err(err)?;
        opt.step().map_err(err)?;
        opt.zero_grad(true).map_err(err)
    };
    step()?;
    let ms = median_of(steps, &mut step)? * 1e3;
    let tokens = (batch * CONFIG.block_size) as f64;
    eprintln!("bench train: gpt (nanoGPT char), batch {batch}: {ms:.2} ms per step");
    let mut rows = vec![Row::new(
        GROUP,
        format!("gpt 4x128 (nanoGPT char), 64 tokens, batch {batch}, AdamW + clip: step time"),
        "ms",
        ms,
        "tokens per second (ratio = tokens/s)",
        tokens * 1e3 / ms,
    )];
    let mut pairs = Pairs::new(GROUP, options);
    let id = format!("gpt_step/{batch}");
    pairs.add(&format!("gpt step ({id})"), &id, Figure::Millis, ms, || {
        Ok(median_of(steps, &mut step)? * 1e3)
    })?;
    rows.extend(pairs.into_rows());
    Ok(rows)
}
