//! A GPT-style decoder-only Transformer: token and position embeddings, pre-norm causal
//! blocks (`TransformerEncoderLayer` with `norm_first` and a causal mask, tanh-GELU), a final
//! LayerNorm and a bias-free language-model head. Names: `wte`, `wpe`, `drop`, `h.0...`, `ln_f`,
//! `lm_head`. Linear and embedding weights are drawn from `N(0, 0.02^2)` and biases zeroed, as
//! GPT-2 does.

use crate::error::{config_err, input_err};
use crate::fits::{check_weights_fit, f32_bytes};
use crate::init;
use crate::layers::{
    Activation, Dropout, Embedding, LayerNorm, Linear, Sequential, TransformerEncoderLayer,
    TransformerEncoderLayerConfig,
};
use crate::trace::{Act, Tracer};
use crate::{layer_casts, module_tree, Layer, Result};
use kiln_autograd::{DType, Module, Tensor};

/// A GPT's size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GptConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Longest sequence (rows of the position embedding).
    pub block_size: usize,
    /// Blocks.
    pub n_layer: usize,
    /// Heads per block.
    pub n_head: usize,
    /// Width.
    pub n_embd: usize,
    /// Dropout on embeddings, attention and residual branches.
    pub dropout: f64,
}

impl GptConfig {
    /// GPT-2 small's shape (124M parameters with a tied head; kiln's head is untied).
    pub fn gpt2_small() -> Self {
        GptConfig {
            vocab_size: 50257,
            block_size: 1024,
            n_layer: 12,
            n_head: 12,
            n_embd: 768,
            dropout: 0.0,
        }
    }

    /// A tiny model for tests.
    pub fn tiny() -> Self {
        GptConfig {
            vocab_size: 64,
            block_size: 16,
            n_layer: 2,
            n_head: 2,
            n_embd: 16,
            dropout: 0.0,
        }
    }
}

/// Bytes of the f32 weights of every block's attention (`4 d^2`) and feed-forward (`8 d^2`)
/// matrices, both embeddings and the head: a lower bound on the parameters (`None`: it
/// overflows).
fn weight_bytes(c: &GptConfig) -> Option<usize> {
    let d = c.n_embd;
    let blocks = f32_bytes(d.checked_mul(d)?, 12)?.checked_mul(c.n_layer)?;
    let rows = c.vocab_size.checked_mul(2)?.checked_add(c.block_size)?;
    blocks.checked_add(f32_bytes(rows, d)?)
}

/// The decoder-only Transformer; `forward` takes `i64` token ids `[B, T]` and returns logits
/// `[B, T, vocab_size]`.
#[derive(Debug)]
pub struct Gpt {
    /// Token embedding.
    pub wte: Embedding,
    /// Position embedding.
    pub wpe: Embedding,
    /// Dropout on the summed embeddings.
    pub drop: Dropout,
    /// The blocks.
    pub h: Sequential,
    /// Final norm.
    pub ln_f: LayerNorm,
    /// Logits projection (no bias).
    pub lm_head: Linear,
    /// The configuration.
    pub config: GptConfig,
    training: bool,
}

impl Gpt {
    /// Builds a GPT.
    pub fn new(c: GptConfig) -> Result<Self> {
        if c.vocab_size == 0 || c.block_size == 0 || c.n_layer == 0 {
            return Err(config_err(
                "Gpt",
                "vocab_size, block_size and n_layer must be positive",
            ));
        }
        check_weights_fit(
            "Gpt",
            weight_bytes(&c),
            format!(
                "n_layer {}, n_embd {}, vocab_size {} and block_size {}",
                c.n_layer, c.n_embd, c.vocab_size, c.block_size
            ),
            "use fewer layers, a smaller width or a smaller vocabulary",
        )?;
        let mut h = Sequential::new();
        for _ in 0..c.n_layer {
            let block = TransformerEncoderLayer::new(TransformerEncoderLayerConfig {
                dim_feedforward: 4 * c.n_embd,
                dropout: c.dropout,
                activation: Activation::GeluTanh,
                norm_first: true,
                causal: true,
                ..TransformerEncoderLayerConfig::new(c.n_embd, c.n_head)
            })?;
            h = h.push(block);
        }
        let m = Gpt {
            wte: Embedding::new(c.vocab_size, c.n_embd)?,
            wpe: Embedding::new(c.block_size, c.n_embd)?,
            drop: Dropout::new(c.dropout)?,
            h,
            ln_f: LayerNorm::new(&[c.n_embd], 1e-5)?,
            lm_head: Linear::new(c.n_embd, c.vocab_size, false)?,
            config: c,
            training: true,
        };
        for (name, p) in m.named_parameters() {
            if name.contains("norm") || name.starts_with("ln_f") {
                continue;
            }
            if p.rank() >= 2 {
                init::renormal_(&p, 0.0, 0.02)?;
            } else {
                init::fill_(&p, 0.0)?;
            }
        }
        Ok(m)
    }

    fn check(&self, shape: &[usize], dtype: DType) -> Result<()> {
        if shape.len() != 2 || shape[1] == 0 || shape[1] > self.config.block_size {
            return Err(input_err(
                "Gpt",
                format!(
                    "expected token ids [B, T] with 1 <= T <= block_size {}, got {shape:?}",
                    self.config.block_size
                ),
            ));
        }
        if dtype != DType::I64 {
            return Err(input_err(
                "Gpt",
                format!("token ids must be i64, got {dtype}"),
            ));
        }
        Ok(())
    }
}

impl Module for Gpt {
    module_tree!();
}

impl Layer for Gpt {
    fn type_name(&self) -> &'static str {
        "Gpt"
    }

    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        // The whole pass on kiln's CPU pool, not op by op.
        kiln_autograd::on_cpu_pool(ids.device(), || {
            self.check(ids.shape(), ids.dtype())?;
            let t = ids.shape()[1];
            let pos = Tensor::arange(0.0, t as f64, 1.0, DType::I64, ids.device())?;
            use crate::scope::forward_in;
            let x = forward_in("wte", &self.wte, ids)?.add(&forward_in("wpe", &self.wpe, &pos)?)?;
            let x = forward_in("drop", &self.drop, &x)?;
            let x = forward_in("h", &self.h, &x)?;
            let x = forward_in("ln_f", &self.ln_f, &x)?;
            forward_in("lm_head", &self.lm_head, &x)
        })
    }

    fn trace(&self, tr: &mut Tracer, ids: &Act) -> Result<Act> {
        self.check(ids.shape(), ids.dtype())?;
        let tok = tr.call("wte", &self.wte, ids)?;
        let pos_ids = tr.input(&[ids.shape()[1]], DType::I64);
        let pos = tr.call("wpe", &self.wpe, &pos_ids)?;
        let x = tr.output(&[&tok, &pos], tok.shape(), tok.dtype(), false);
        let x = tr.call("drop", &self.drop, &x)?;
        let x = tr.call("h", &self.h, &x)?;
        let x = tr.call("ln_f", &self.ln_f, &x)?;
        tr.call("lm_head", &self.lm_head, &x)
    }

    fn layers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("wte".into(), &self.wte as &dyn Layer),
            ("wpe".into(), &self.wpe),
            ("drop".into(), &self.drop),
            ("h".into(), &self.h),
            ("ln_f".into(), &self.ln_f),
            ("lm_head".into(), &self.lm_head),
        ]
    }

    fn layers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![
            ("wte".into(), &mut self.wte as &mut dyn Layer),
            ("wpe".into(), &mut self.wpe),
            ("drop".into(), &mut self.drop),
            ("h".into(), &mut self.h),
            ("ln_f".into(), &mut self.ln_f),
            ("lm_head".into(), &mut self.lm_head),
        ]
    }

    layer_casts!();
}
