//! Vision Transformer with torchvision's structure and names (`VisionTransformer`):
//! `conv_proj` (patch embedding), `class_token`, `encoder` (`pos_embedding`, `dropout`, `layers`
//! = `encoder_layer_0`.. each with `ln_1`, `self_attention`, `dropout`, `ln_2`, `mlp` = `MLPBlock`
//! of `Linear`, `GELU`, `Dropout`, `Linear`, `Dropout`; then `ln`), and `heads.head`.
//!
//! Init follows torchvision: patch-embedding weights `N(0, 1 / fan_in)` (torchvision truncates
//! the normal at two standard deviations; kiln does not), bias zero; class token zero; position
//! embedding `N(0, 0.02^2)`; MLP weights xavier-uniform, biases `N(0, 1e-12)`; head zero.
//! LayerNorms use `eps = 1e-6`.

use crate::error::{config_err, input_err};
use crate::fits::{check_weights_fit, f32_bytes};
use crate::init;
use crate::layers::{
    Conv2d, Conv2dConfig, Dropout, LayerNorm, Linear, MultiheadAttention, Sequential, GELU,
};
use crate::trace::{Act, Tracer};
use crate::{layer_casts, module_tree, Layer, Result};
use kiln_autograd::{Module, Parameter, Tensor};

/// A ViT's size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VitConfig {
    /// Input height and width.
    pub image_size: usize,
    /// Patch side.
    pub patch_size: usize,
    /// Encoder blocks.
    pub num_layers: usize,
    /// Attention heads.
    pub num_heads: usize,
    /// Token width.
    pub hidden_dim: usize,
    /// MLP hidden width.
    pub mlp_dim: usize,
    /// Dropout after the embedding and in the blocks.
    pub dropout: f64,
    /// Dropout on attention weights.
    pub attention_dropout: f64,
    /// Classes.
    pub num_classes: usize,
}

impl VitConfig {
    /// ViT-B/16 (86,567,656 parameters with 1000 classes).
    pub fn b16(num_classes: usize) -> Self {
        VitConfig {
            image_size: 224,
            patch_size: 16,
            num_layers: 12,
            num_heads: 12,
            hidden_dim: 768,
            mlp_dim: 3072,
            dropout: 0.0,
            attention_dropout: 0.0,
            num_classes,
        }
    }

    /// A tiny ViT for 32x32 inputs (tests, CPU experiments).
    pub fn tiny(num_classes: usize) -> Self {
        VitConfig {
            image_size: 32,
            patch_size: 8,
            num_layers: 2,
            num_heads: 2,
            hidden_dim: 32,
            mlp_dim: 64,
            dropout: 0.0,
            attention_dropout: 0.0,
            num_classes,
        }
    }
}

/// One pre-norm encoder block (torchvision's `EncoderBlock`).
#[derive(Debug)]
pub struct EncoderBlock {
    /// Norm before attention.
    pub ln_1: LayerNorm,
    /// Self-attention.
    pub self_attention: MultiheadAttention,
    /// Dropout after attention.
    pub dropout: Dropout,
    /// Norm before the MLP.
    pub ln_2: LayerNorm,
    /// `MLPBlock`: Linear, GELU, Dropout, Linear, Dropout.
    pub mlp: Sequential,
    training: bool,
}

impl EncoderBlock {
    fn new(c: &VitConfig) -> Result<Self> {
        let fc1 = Linear::new(c.hidden_dim, c.mlp_dim, true)?;
        let fc2 = Linear::new(c.mlp_dim, c.hidden_dim, true)?;
        for l in [&fc1, &fc2] {
            let w = init::xavier_uniform(l.weight.shape())?;
            let _g = kiln_autograd::NoGradGuard::new();
            l.weight.copy_(&w)?;
            if let Some(b) = &l.bias {
                init::renormal_(b, 0.0, 1e-6)?;
            }
        }
        Ok(EncoderBlock {
            ln_1: LayerNorm::new(&[c.hidden_dim], 1e-6)?,
            self_attention: MultiheadAttention::new(
                c.hidden_dim,
                c.num_heads,
                c.attention_dropout,
            )?,
            dropout: Dropout::new(c.dropout)?,
            ln_2: LayerNorm::new(&[c.hidden_dim], 1e-6)?,
            mlp: Sequential::new()
                .push(fc1)
                .push(GELU::new())
                .push(Dropout::new(c.dropout)?)
                .push(fc2)
                .push(Dropout::new(c.dropout)?)
                .with_type_name("MLPBlock"),
            training: true,
        })
    }
}

impl Module for EncoderBlock {
    module_tree!();
}

impl Layer for EncoderBlock {
    fn type_name(&self) -> &'static str {
        "EncoderBlock"
    }

    fn forward(&self, input: &Tensor) -> Result<Tensor> {
        use crate::scope::forward_in;
        let x = forward_in("ln_1", &self.ln_1, input)?;
        let x = forward_in("self_attention", &self.self_attention, &x)?;
        let x = forward_in("dropout", &self.dropout, &x)?;
        // The residual sums go into the block's own output where no one else holds it (`b + x`
        // is `x + b` bit for bit).
        let x = x.into_add(input)?;
        let y = forward_in("ln_2", &self.ln_2, &x)?;
        let y = forward_in("mlp", &self.mlp, &y)?;
        Ok(y.into_add(&x)?)
    }

    fn trace(&self, t: &mut Tracer, input: &Act) -> Result<Act> {
        let x = t.call("ln_1", &self.ln_1, input)?;
        let x = t.call("self_attention", &self.self_attention, &x)?;
        let x = t.call("dropout", &self.dropout, &x)?;
        let x = t.output(&[&x, input], x.shape(), x.dtype(), false);
        let y = t.call("ln_2", &self.ln_2, &x)?;
        let y = t.call("mlp", &self.mlp, &y)?;
        Ok(t.output(&[&x, &y], x.shape(), x.dtype(), false))
    }

    fn layers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("ln_1".into(), &self.ln_1 as &dyn Layer),
            ("self_attention".into(), &self.self_attention),
            ("dropout".into(), &self.dropout),
            ("ln_2".into(), &self.ln_2),
            ("mlp".into(), &self.mlp),
        ]
    }

    fn layers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![
            ("ln_1".into(), &mut self.ln_1 as &mut dyn Layer),
            ("self_attention".into(), &mut self.self_attention),
            ("dropout".into(), &mut self.dropout),
            ("ln_2".into(), &mut self.ln_2),
            ("mlp".into(), &mut self.mlp),
        ]
    }

    layer_casts!();
}

/// The encoder: position embedding, dropout, blocks, final norm (torchvision's `Encoder`).
#[derive(Debug)]
pub struct Encoder {
    /// `[1, 1 + patches, hidden]`.
    pub pos_embedding: Parameter,
    /// After adding positions.
    pub dropout: Dropout,
    /// `encoder_layer_0`, ...
    pub layers: Sequential,
    /// Final norm.
    pub ln: LayerNorm,
    training: bool,
}

impl Module for Encoder {
    fn own_parameters(&self) -> Vec<(String, Parameter)> {
        vec![("pos_embedding".into(), self.pos_embedding.clone())]
    }
    module_tree!();
}

impl Layer for Encoder {
    fn type_name(&self) -> &'static str {
        "Encoder"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        use crate::scope::forward_in;
        let x = forward_in("dropout", &self.dropout, &x.add(&self.pos_embedding)?)?;
        let x = forward_in("layers", &self.layers, &x)?;
        forward_in("ln", &self.ln, &x)
    }

    fn trace(&self, t: &mut Tracer, x: &Act) -> Result<Act> {
        let rg = self.pos_embedding.requires_grad();
        let x = t.output(&[x], x.shape(), x.dtype(), rg);
        let x = t.call("dropout", &self.dropout, &x)?;
        let x = t.call("layers", &self.layers, &x)?;
        t.call("ln", &self.ln, &x)
    }

    fn layers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("dropout".into(), &self.dropout as &dyn Layer),
            ("layers".into(), &self.layers),
            ("ln".into(), &self.ln),
        ]
    }

    fn layers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![
            ("dropout".into(), &mut self.dropout as &mut dyn Layer),
            ("layers".into(), &mut self.layers),
            ("ln".into(), &mut self.ln),
        ]
    }

    layer_casts!();
}

/// Bytes of the f32 weights of every block's attention (`4 d^2`) and MLP (`2 d mlp_dim`)
/// matrices, the position embedding and the patch projection: a lower bound on the
/// parameters (`None`: it overflows). `patch_size` must be positive.
fn weight_bytes(c: &VitConfig) -> Option<usize> {
    let d = c.hidden_dim;
    let attention = d.checked_mul(d)?.checked_mul(4)?;
    let mlp = d.checked_mul(c.mlp_dim)?.checked_mul(2)?;
    let blocks = attention.checked_add(mlp)?.checked_mul(c.num_layers)?;
    let side = c.image_size / c.patch_size;
    let seq = side.checked_mul(side)?.checked_add(1)?;
    let projection = c.patch_size.checked_mul(c.patch_size)?.checked_mul(3)?;
    f32_bytes(
        blocks.checked_add(seq.checked_add(projection)?.checked_mul(d)?)?,
        1,
    )
}

/// torchvision's `VisionTransformer`.
#[derive(Debug)]
pub struct VisionTransformer {
    /// Patch embedding: `Conv2d(3, hidden, patch, stride = patch)`.
    pub conv_proj: Conv2d,
    /// `[1, 1, hidden]`.
    pub class_token: Parameter,
    /// The encoder.
    pub encoder: Encoder,
    /// `head`: `Linear(hidden, num_classes)`.
    pub heads: Sequential,
    /// The configuration.
    pub config: VitConfig,
    training: bool,
}

impl VisionTransformer {
    /// Builds a ViT.
    pub fn new(c: VitConfig) -> Result<Self> {
        if c.patch_size == 0
            || !c.image_size.is_multiple_of(c.patch_size.max(1))
            || c.num_layers == 0
        {
            return Err(config_err(
                "VisionTransformer",
                format!(
                    "image_size {} must be a multiple of patch_size {} and num_layers {} positive",
                    c.image_size, c.patch_size, c.num_layers
                ),
            ));
        }
        check_weights_fit(
            "VisionTransformer",
            weight_bytes(&c),
            format!(
                "num_layers {}, hidden_dim {}, mlp_dim {} and {} patches of side {}",
                c.num_layers,
                c.hidden_dim,
                c.mlp_dim,
                c.image_size / c.patch_size,
                c.patch_size
            ),
            "use fewer layers, smaller widths or larger patches",
        )?;
        let d = c.hidden_dim;
        let p = c.patch_size;
        // In range: `weight_bytes` computed it checked.
        let seq = (c.image_size / p).pow(2) + 1;
        let conv_proj = Conv2d::from_parts(
            init::normal(&[d, 3, p, p], 0.0, (1.0 / (3 * p * p) as f64).sqrt())?,
            Some(init::constant(&[d], 0.0)?),
            Conv2dConfig::default().stride(p),
        )?;
        let mut layers = Sequential::new();
        for i in 0..c.num_layers {
            layers = layers.push_named(&format!("encoder_layer_{i}"), EncoderBlock::new(&c)?)?;
        }
        let head = Linear::new(d, c.num_classes, true)?;
        init::fill_(&head.weight, 0.0)?;
        if let Some(b) = &head.bias {
            init::fill_(b, 0.0)?;
        }
        Ok(VisionTransformer {
            conv_proj,
            class_token: init::constant(&[1, 1, d], 0.0)?,
            encoder: Encoder {
                pos_embedding: init::normal(&[1, seq, d], 0.0, 0.02)?,
                dropout: Dropout::new(c.dropout)?,
                layers,
                ln: LayerNorm::new(&[d], 1e-6)?,
                training: true,
            },
            heads: Sequential::new().push_named("head", head)?,
            config: c,
            training: true,
        })
    }

    fn check(&self, x: &[usize]) -> Result<()> {
        let s = self.config.image_size;
        if x.len() != 4 || x[1] != 3 || x[2] != s || x[3] != s {
            return Err(input_err(
                "VisionTransformer",
                format!("expected an [N, 3, {s}, {s}] input, got {x:?}"),
            ));
        }
        Ok(())
    }
}

impl Module for VisionTransformer {
    fn own_parameters(&self) -> Vec<(String, Parameter)> {
        vec![("class_token".into(), self.class_token.clone())]
    }
    module_tree!();
}

impl Layer for VisionTransformer {
    fn type_name(&self) -> &'static str {
        "VisionTransformer"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // The whole pass on kiln's CPU pool, not op by op.
        kiln_autograd::on_cpu_pool(x.device(), || {
            self.check(x.shape())?;
            let n = x.shape()[0];
            let d = self.config.hidden_dim;
            use crate::scope::forward_in;
            let patches = forward_in("conv_proj", &self.conv_proj, x)?
                .flatten(2, -1)?
                .permute(&[0, 2, 1])?;
            let cls = self.class_token.expand(&[n, 1, d])?;
            let tokens = Tensor::cat(&[cls, patches], 1)?;
            let h = forward_in("encoder", &self.encoder, &tokens)?;
            forward_in("heads", &self.heads, &h.select(1, 0)?)
        })
    }

    fn trace(&self, t: &mut Tracer, x: &Act) -> Result<Act> {
        self.check(x.shape())?;
        let p = t.call("conv_proj", &self.conv_proj, x)?;
        let (n, d) = (p.shape()[0], p.shape()[1]);
        let seq = p.shape()[2] * p.shape()[3] + 1;
        let rg = self.class_token.requires_grad();
        let tokens = t.output(&[&p], &[n, seq, d], p.dtype(), rg);
        let h = t.call("encoder", &self.encoder, &tokens)?;
        let cls = t.view(&h, &[n, d]);
        t.call("heads", &self.heads, &cls)
    }

    fn layers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("conv_proj".into(), &self.conv_proj as &dyn Layer),
            ("encoder".into(), &self.encoder),
            ("heads".into(), &self.heads),
        ]
    }

    fn layers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![
            ("conv_proj".into(), &mut self.conv_proj as &mut dyn Layer),
            ("encoder".into(), &mut self.encoder),
            ("heads".into(), &mut self.heads),
        ]
    }

    layer_casts!();
}
