//! `MultiheadAttention` (batch-first), with causal, boolean/additive and key-padding masks.
//!
//! Parameters follow PyTorch's packed layout and names: `in_proj_weight` `[3E, E]` (query, key
//! and value rows stacked, xavier-uniform), `in_proj_bias` `[3E]` (zeros), and the child
//! `out_proj` (a `Linear`, bias zeroed). Masks follow PyTorch's conventions: in a boolean mask
//! `true` means "do not attend"; a float `attn_mask` is added to the scores; a 3-D `attn_mask`
//! is PyTorch's `[B * num_heads, T, S]`, batch-major.
//!
//! Invariant: a query position whose every key is masked attends to nothing (weights 0, so its
//! output is `out_proj`'s bias) instead of NaN, as PyTorch's `scaled_dot_product_attention`
//! path (the one its Transformer layers take) does; its `need_weights=True` path gives NaN,
//! which would reach every gradient of the batch.

use crate::error::{config_err, input_err};
use crate::functional;
use crate::init;
use crate::layer::any_trainable;
use crate::layers::Linear;
use crate::trace::{Act, Tracer};
use crate::{layer_casts, module_tree, Layer, Result};
use kiln_autograd::{broadcast_shapes, DType, Module, Parameter, Tensor};

/// Masks for one attention call.
#[derive(Debug, Clone, Copy, Default)]
pub struct AttentionMasks<'a> {
    /// Bool (`true` = blocked) or float (added to the scores): `[T, S]`, PyTorch's
    /// `[B * H, T, S]`, or `[B, H, T, S]`; sizes of 1 broadcast, except in a 3-D mask.
    pub attn_mask: Option<&'a Tensor>,
    /// `[B, S]` bool, `true` at padding positions of the keys.
    pub key_padding_mask: Option<&'a Tensor>,
    /// Blocks attention to later positions (`j > i`), as `is_causal=True`.
    pub is_causal: bool,
}

/// Multi-head scaled dot-product attention (`torch.nn.MultiheadAttention(batch_first=True)`).
#[derive(Debug)]
pub struct MultiheadAttention {
    /// `[3 * embed_dim, embed_dim]`.
    pub in_proj_weight: Parameter,
    /// `[3 * embed_dim]`.
    pub in_proj_bias: Parameter,
    /// Output projection.
    pub out_proj: Linear,
    /// Number of heads.
    pub num_heads: usize,
    /// Dropout probability on the attention weights (training only).
    pub dropout: f64,
    training: bool,
}

impl MultiheadAttention {
    /// `MultiheadAttention(embed_dim, num_heads, dropout)` with PyTorch's init.
    pub fn new(embed_dim: usize, num_heads: usize, dropout: f64) -> Result<Self> {
        if embed_dim == 0 || num_heads == 0 || !embed_dim.is_multiple_of(num_heads) {
            return Err(config_err(
                "MultiheadAttention",
                format!(
                    "embed_dim {embed_dim} must be positive and divisible by num_heads {num_heads}"
                ),
            ));
        }
        let qkv = embed_dim.checked_mul(3).ok_or_else(|| {
            config_err(
                "MultiheadAttention",
                format!("embed_dim {embed_dim} is past any tensor's size (3 x it overflows)"),
            )
        })?;
        let in_proj_weight = init::xavier_uniform(&[qkv, embed_dim])?;
        let in_proj_bias = init::constant(&[qkv], 0.0)?;
        let out_proj = Linear::new(embed_dim, embed_dim, true)?;
        if let Some(b) = &out_proj.bias {
            init::fill_(b, 0.0)?;
        }
        Ok(MultiheadAttention {
            in_proj_weight,
            in_proj_bias,
            out_proj,
            num_heads,
            dropout: functional::check_dropout("MultiheadAttention", dropout)?,
            training: true,
        })
    }

    /// Embedding width `E`.
    pub fn embed_dim(&self) -> usize {
        self.in_proj_weight.shape()[1]
    }

    fn check(&self, q: &[usize], k: &[usize], v: &[usize]) -> Result<()> {
        let e = self.embed_dim();
        let ok = q.len() == 3
            && k.len() == 3
            && v.len() == 3
            && q[2] == e
            && k[2] == e
            && v[2] == e
            && k[0] == q[0]
            && v[..2] == k[..2];
        if !ok {
            return Err(input_err(
                "MultiheadAttention",
                format!(
                    "expected batch-first query [B, T, {e}] and key/value [B, S, {e}], got {q:?}, \
                     {k:?}, {v:?}"
                ),
            ));
        }
        Ok(())
    }

    /// Projects `x` `[B, L, E]` with rows `part*E..(part+1)*E` of the packed weights and splits
    /// heads: `[B, H, L, E/H]`.
    fn project(&self, x: &Tensor, part: usize) -> Result<Tensor> {
        let e = self.embed_dim();
        let w = self.in_proj_weight.narrow(0, part * e, e)?;
        let b = self.in_proj_bias.narrow(0, part * e, e)?;
        let y = x.matmul(&w.t()?)?.add(&b)?;
        let (bs, l) = (x.shape()[0], x.shape()[1]);
        let hd = e / self.num_heads;
        Ok(y.reshape_to(&[bs, l, self.num_heads, hd])?
            .permute(&[0, 2, 1, 3])?)
    }

    /// Attention of `query` `[B, T, E]` over `key`/`value` `[B, S, E]`: `[B, T, E]`.
    pub fn attend(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        masks: AttentionMasks<'_>,
    ) -> Result<Tensor> {
        self.check(query.shape(), key.shape(), value.shape())?;
        let (bs, t, e) = (query.shape()[0], query.shape()[1], self.embed_dim());
        let s = key.shape()[1];
        let hd = e / self.num_heads;
        let q = self.project(query, 0)?;
        let k = self.project(key, 1)?;
        let v = self.project(value, 2)?;
        let mut scores = q
            .matmul(&k.transpose(-2, -1)?)?
            .mul_scalar(1.0 / (hd as f64).sqrt())?;
        if masks.is_causal {
            let later = Tensor::ones(&[t, s], DType::F32, query.device())?
                .triu(1)?
                .gt_scalar(0.0)?;
            scores = scores.masked_fill(&later, f64::NEG_INFINITY)?;
        }
        if let Some(m) = masks.attn_mask {
            let m = &self.attn_mask_as_4d(m, [bs, t, s])?;
            scores = if m.dtype() == DType::Bool {
                scores.masked_fill(m, f64::NEG_INFINITY)?
            } else {
                scores.add(m)?
            };
        }
        if let Some(m) = masks.key_padding_mask {
            if m.shape() != [bs, s] || m.dtype() != DType::Bool {
                return Err(input_err(
                    "MultiheadAttention",
                    format!(
                        "key_padding_mask must be a bool [{bs}, {s}] tensor (true at padding), got \
                         {} {:?}",
                        m.dtype(),
                        m.shape()
                    ),
                ));
            }
            scores = scores.masked_fill(&m.reshape_to(&[bs, 1, 1, s])?, f64::NEG_INFINITY)?;
        }
        // Causal masking alone leaves every query its first key; other masks may block a row.
        // The blocks below drop each intermediate as soon as the next step has it, as one
        // chained expression would (a binding would hold its buffer to the end of `attend`).
        let masked = masks.attn_mask.is_some() || masks.key_padding_mask.is_some();
        let (attn, blocked) = {
            let (probs, blocked) = match masked {
                true => softmax_of_open_rows(&scores)?,
                false => (scores.softmax(-1)?, None),
            };
            (
                functional::dropout(&probs, self.dropout, self.training)?,
                blocked,
            )
        };
        let ctx = {
            let ctx = attn.matmul(&v)?;
            match blocked {
                Some(blocked) => ctx.masked_fill(&blocked, 0.0)?,
                None => ctx,
            }
        }
        .permute(&[0, 2, 1, 3])?
        .contiguous()?
        .reshape_to(&[bs, t, e])?;
        self.out_proj.forward(&ctx)
    }

    /// `mask` as `[B, H, T, S]` or a shape that broadcasts to it: a 3-D mask must be PyTorch's
    /// `[B * H, T, S]` (read batch-major); other ranks broadcast without enlarging the scores.
    fn attn_mask_as_4d(&self, mask: &Tensor, [bs, t, s]: [usize; 3]) -> Result<Tensor> {
        let h = self.num_heads;
        let full = [bs, h, t, s];
        let shape = mask.shape();
        if shape.len() == 3 {
            let want = [bs * h, t, s];
            if shape != want {
                return Err(input_err(
                    "MultiheadAttention",
                    format!(
                        "a 3-D attn_mask is PyTorch's [B * num_heads, T, S] = {want:?}, got \
                         {shape:?}; for one mask per head shared by the batch pass \
                         [1, {h}, {t}, {s}]"
                    ),
                ));
            }
            return Ok(mask.reshape_to(&full)?);
        }
        let fits = broadcast_shapes("MultiheadAttention", shape, &full).is_ok_and(|s| s == full);
        if !fits {
            return Err(input_err(
                "MultiheadAttention",
                format!(
                    "attn_mask of shape {shape:?} does not fit the scores [B, num_heads, T, S] = \
                     {full:?}: pass [T, S] = [{t}, {s}], [B * num_heads, T, S] or \
                     [B, num_heads, T, S] (sizes of 1 broadcast, except in a 3-D mask)"
                ),
            ));
        }
        Ok(mask.clone())
    }

    /// Shape-only `attend` (self-attention when `key`/`value` are `query`).
    pub fn trace_attend(&self, tracer: &mut Tracer, q: &Act, k: &Act, v: &Act) -> Result<Act> {
        self.check(q.shape(), k.shape(), v.shape())?;
        let (bs, t, s) = (q.shape()[0], q.shape()[1], k.shape()[1]);
        let trainable = any_trainable([&self.in_proj_weight, &self.in_proj_bias]);
        let ctx = tracer.output(&[q, k, v], &[bs, t, self.embed_dim()], q.dtype(), trainable);
        if !ctx.requires_grad() {
            return Ok(self.trace_out_proj(tracer, &ctx));
        }
        if self.in_proj_weight.requires_grad() {
            // Only the projection weight's gradient reads the inputs.
            for x in [q, k, v] {
                tracer.save(x);
            }
        }
        // Projected q, k, v are kept for the two attention matmuls, the probabilities for the
        // softmax backward and the matmul with v.
        let hd = self.embed_dim() / self.num_heads;
        for l in [t, s, s] {
            tracer.save_new(&[bs, self.num_heads, l, hd], q.dtype());
        }
        let probs = [bs, self.num_heads, t, s];
        tracer.save_new(&probs, q.dtype());
        if self.training && self.dropout > 0.0 {
            // The scaled mask and the dropped probabilities (the operand of the matmul with v).
            tracer.save_new(&probs, q.dtype());
            tracer.save_new(&probs, q.dtype());
        }
        Ok(self.trace_out_proj(tracer, &ctx))
    }

    /// PyTorch applies `out_proj` functionally (its weights, not its `forward`), so torchinfo
    /// never sees it run: traced here without a row of its own.
    fn trace_out_proj(&self, tracer: &mut Tracer, ctx: &Act) -> Act {
        let w = &self.out_proj.weight;
        if w.requires_grad() {
            tracer.save(ctx);
        }
        let trainable = any_trainable(std::iter::once(w).chain(&self.out_proj.bias));
        tracer.output(&[ctx], ctx.shape(), ctx.dtype(), trainable)
    }
}

/// Softmax over the last dim of `scores` `[B, H, T, S]` with the rows whose every score is
/// -inf (blocked rows) set to 0 first, so they come out uniform instead of NaN, and those rows
/// as `[B, H, T, 1]` (`None` when there are no keys). The caller zeroes the blocked rows of the
/// attention output (PyTorch's `_safe_softmax` gives them weights 0): the gradient there is 0,
/// so the softmax's backward passes none to them, and no tensor of the scores' size is kept
/// beyond the softmax output that a plain softmax keeps too.
fn softmax_of_open_rows(scores: &Tensor) -> Result<(Tensor, Option<Tensor>)> {
    if scores.shape().last() == Some(&0) {
        return Ok((scores.softmax(-1)?, None));
    }
    let blocked =
        kiln_autograd::no_grad(|| scores.amax(&[-1], true)?.eq_scalar(f64::NEG_INFINITY))?;
    let open = scores.masked_fill(&blocked, 0.0)?;
    Ok((open.softmax(-1)?, Some(blocked)))
}

impl Module for MultiheadAttention {
    fn own_parameters(&self) -> Vec<(String, Parameter)> {
        vec![
            ("in_proj_weight".to_string(), self.in_proj_weight.clone()),
            ("in_proj_bias".to_string(), self.in_proj_bias.clone()),
        ]
    }
    module_tree!();
}

impl Layer for MultiheadAttention {
    fn type_name(&self) -> &'static str {
        "MultiheadAttention"
    }

    /// Self-attention without masks.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.attend(x, x, x, AttentionMasks::default())
    }

    fn trace(&self, tracer: &mut Tracer, x: &Act) -> Result<Act> {
        self.trace_attend(tracer, x, x, x)
    }

    fn layers(&self) -> Vec<(String, &dyn Layer)> {
        vec![("out_proj".to_string(), &self.out_proj as &dyn Layer)]
    }

    fn layers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![("out_proj".to_string(), &mut self.out_proj as &mut dyn Layer)]
    }

    layer_casts!();
}
