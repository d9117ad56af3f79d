//! `TransformerEncoderLayer`: self-attention and a feed-forward block, post-norm (PyTorch's
//! default) or pre-norm (`norm_first`), batch-first.

use crate::error::config_err;

use crate::layers::{AttentionMasks, Dropout, LayerNorm, Linear, MultiheadAttention};
use crate::trace::{Act, Tracer};
use crate::{layer_casts, module_tree, Layer, Result};
use kiln_autograd::{Module, Tensor};

/// The feed-forward activation (PyTorch passes a function, so it is not a child module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `F.relu` (the default).
    Relu,
    /// `F.gelu` (exact).
    Gelu,
    /// `F.gelu(approximate="tanh")` (GPT-2).
    GeluTanh,
}

/// Options of a [`TransformerEncoderLayer`] (PyTorch's defaults apart from `d_model`/`nhead`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TransformerEncoderLayerConfig {
    /// Model width.
    pub d_model: usize,
    /// Attention heads.
    pub nhead: usize,
    /// Hidden width of the feed-forward block (2048).
    pub dim_feedforward: usize,
    /// Dropout after attention, inside and after the feed-forward block (0.1).
    pub dropout: f64,
    /// Feed-forward activation (ReLU).
    pub activation: Activation,
    /// LayerNorm epsilon (1e-5).
    pub layer_norm_eps: f64,
    /// Pre-norm when true (GPT, ViT), post-norm otherwise (the original Transformer).
    pub norm_first: bool,
    /// Always apply a causal mask (decoder-only models); kiln's addition.
    pub causal: bool,
}

impl TransformerEncoderLayerConfig {
    /// PyTorch's defaults for `d_model` and `nhead`.
    pub fn new(d_model: usize, nhead: usize) -> Self {
        TransformerEncoderLayerConfig {
            d_model,
            nhead,
            dim_feedforward: 2048,
            dropout: 0.1,
            activation: Activation::Relu,
            layer_norm_eps: 1e-5,
            norm_first: false,
            causal: false,
        }
    }
}

/// `torch.nn.TransformerEncoderLayer(batch_first=True)` with PyTorch's child names:
/// `self_attn`, `linear1`, `dropout`, `linear2`, `norm1`, `norm2`, `dropout1`, `dropout2`.
#[derive(Debug)]
pub struct TransformerEncoderLayer {
    /// Self-attention.
    pub self_attn: MultiheadAttention,
    /// `d_model -> dim_feedforward`.
    pub linear1: Linear,
    /// Dropout inside the feed-forward block.
    pub dropout: Dropout,
    /// `dim_feedforward -> d_model`.
    pub linear2: Linear,
    /// Norm around the attention block.
    pub norm1: LayerNorm,
    /// Norm around the feed-forward block.
    pub norm2: LayerNorm,
    /// Dropout after attention.
    pub dropout1: Dropout,
    /// Dropout after the feed-forward block.
    pub dropout2: Dropout,
    /// The options it was built with.
    pub config: TransformerEncoderLayerConfig,
    training: bool,
}

impl TransformerEncoderLayer {
    /// A layer with PyTorch's init.
    pub fn new(config: TransformerEncoderLayerConfig) -> Result<Self> {
        let c = config;
        if c.dim_feedforward == 0 {
            return Err(config_err(
                "TransformerEncoderLayer",
                "dim_feedforward must be positive",
            ));
        }
        Ok(TransformerEncoderLayer {
            self_attn: MultiheadAttention::new(c.d_model, c.nhead, c.dropout)?,
            linear1: Linear::new(c.d_model, c.dim_feedforward, true)?,
            dropout: Dropout::new(c.dropout)?,
            linear2: Linear::new(c.dim_feedforward, c.d_model, true)?,
            norm1: LayerNorm::new(&[c.d_model], c.layer_norm_eps)?,
            norm2: LayerNorm::new(&[c.d_model], c.layer_norm_eps)?,
            dropout1: Dropout::new(c.dropout)?,
            dropout2: Dropout::new(c.dropout)?,
            config,
            training: true,
        })
    }

    /// The activation of `x`, which it may write over (ReLU: `into_relu`).
    fn activate(&self, x: Tensor) -> Result<Tensor> {
        Ok(match self.config.activation {
            Activation::Relu => x.into_relu()?,
            Activation::Gelu => x.gelu()?,
            Activation::GeluTanh => x.gelu_tanh()?,
        })
    }

    fn attention_block(&self, x: &Tensor, masks: AttentionMasks<'_>) -> Result<Tensor> {
        let masks = AttentionMasks {
            is_causal: masks.is_causal || self.config.causal,
            ..masks
        };
        use crate::scope::{forward_in, module};
        let a = {
            let _attn = module("self_attn");
            self.self_attn.attend(x, x, x, masks)?
        };
        forward_in("dropout1", &self.dropout1, &a)
    }

    fn feed_forward_block(&self, x: &Tensor) -> Result<Tensor> {
        use crate::scope::forward_in;
        let h = self.activate(forward_in("linear1", &self.linear1, x)?)?;
        let h = forward_in("dropout", &self.dropout, &h)?;
        let h = forward_in("linear2", &self.linear2, &h)?;
        forward_in("dropout2", &self.dropout2, &h)
    }

    /// The layer with attention masks (`src_mask`, `src_key_padding_mask`, `is_causal`).
    pub fn forward_masked(&self, x: &Tensor, masks: AttentionMasks<'_>) -> Result<Tensor> {
        use crate::scope::forward_in;
        if self.config.norm_first {
            // Each block's output is added to (the sum written over it where no one else
            // holds it; `b + x` is `x + b` bit for bit).
            let n = forward_in("norm1", &self.norm1, x)?;
            let x = self.attention_block(&n, masks)?.into_add(x)?;
            let n = forward_in("norm2", &self.norm2, &x)?;
            Ok(self.feed_forward_block(&n)?.into_add(&x)?)
        } else {
            let s = self.attention_block(x, masks)?.into_add(x)?;
            let x = forward_in("norm1", &self.norm1, &s)?;
            let s = self.feed_forward_block(&x)?.into_add(&x)?;
            forward_in("norm2", &self.norm2, &s)
        }
    }

    fn trace_attention(&self, t: &mut Tracer, x: &Act) -> Result<Act> {
        let a = t.call("self_attn", &self.self_attn, x)?;
        t.call("dropout1", &self.dropout1, &a)
    }

    fn trace_feed_forward(&self, t: &mut Tracer, x: &Act) -> Result<Act> {
        let h = t.call("linear1", &self.linear1, x)?;
        // The activation keeps its input (GELU) or output (ReLU) for backward.
        let a = t.output(&[&h], h.shape(), h.dtype(), false);
        if h.requires_grad() {
            t.save(if self.config.activation == Activation::Relu {
                &a
            } else {
                &h
            });
        }
        let h = t.call("dropout", &self.dropout, &a)?;
        let h = t.call("linear2", &self.linear2, &h)?;
        t.call("dropout2", &self.dropout2, &h)
    }
}

impl Module for TransformerEncoderLayer {
    module_tree!();
}

impl Layer for TransformerEncoderLayer {
    fn type_name(&self) -> &'static str {
        "TransformerEncoderLayer"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_masked(x, AttentionMasks::default())
    }

    fn trace(&self, t: &mut Tracer, x: &Act) -> Result<Act> {
        if self.config.norm_first {
            let n = t.call("norm1", &self.norm1, x)?;
            let a = self.trace_attention(t, &n)?;
            let x = t.output(&[x, &a], a.shape(), a.dtype(), false);
            let n = t.call("norm2", &self.norm2, &x)?;
            let f = self.trace_feed_forward(t, &n)?;
            Ok(t.output(&[&x, &f], f.shape(), f.dtype(), false))
        } else {
            let a = self.trace_attention(t, x)?;
            let s = t.output(&[x, &a], a.shape(), a.dtype(), false);
            let x = t.call("norm1", &self.norm1, &s)?;
            let f = self.trace_feed_forward(t, &x)?;
            let s = t.output(&[&x, &f], f.shape(), f.dtype(), false);
            t.call("norm2", &self.norm2, &s)
        }
    }

    fn layers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("self_attn".into(), &self.self_attn as &dyn Layer),
            ("linear1".into(), &self.linear1),
            ("dropout".into(), &self.dropout),
            ("linear2".into(), &self.linear2),
            ("norm1".into(), &self.norm1),
            ("norm2".into(), &self.norm2),
            ("dropout1".into(), &self.dropout1),
            ("dropout2".into(), &self.dropout2),
        ]
    }

    fn layers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![
            ("self_attn".into(), &mut self.self_attn as &mut dyn Layer),
            ("linear1".into(), &mut self.linear1),
            ("dropout".into(), &mut self.dropout),
            ("linear2".into(), &mut self.linear2),
            ("norm1".into(), &mut self.norm1),
            ("norm2".into(), &mut self.norm2),
            ("dropout1".into(), &mut self.dropout1),
            ("dropout2".into(), &mut self.dropout2),
        ]
    }

    layer_casts!();
}
