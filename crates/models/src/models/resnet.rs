//! ResNet-18/34 (`BasicBlock`) and ResNet-50 (`Bottleneck`) with torchvision's structure,
//! names and init: `conv1`, `bn1`, `relu`, `maxpool`, `layer1`..`layer4` (each a `Sequential`
//! of blocks holding `conv1`, `bn1`, ..., and `downsample` = `Sequential(Conv2d 1x1, BatchNorm2d)`
//! where the shape changes), `avgpool`, `fc`. Conv weights are drawn with
//! `kaiming_normal_(mode="fan_out", nonlinearity="relu")` as torchvision does; stride sits on the
//! 3x3 convolution of a bottleneck (ResNet v1.5). The small-input stem (CIFAR) replaces the 7x7
//! stride-2 `conv1` by a 3x3 stride-1 one and drops the max-pool; parameter names stay the same.
//! [`ResNetDims`] also sets the base width and the input channels (the training recipe's small
//! grayscale or RGB networks); names follow the same rules whatever the dimensions.

use crate::error::config_err;
use crate::fits::{check_weights_fit, f32_bytes};
use crate::init;
use crate::layers::{
    AdaptiveAvgPool2d, BatchNorm2d, Conv2d, Conv2dConfig, Linear, MaxPool2d, ReLU, Sequential,
};
use crate::trace::{Act, Tracer};
use crate::{layer_casts, module_tree, Layer, Result};
use kiln_autograd::{Module, Tensor};

fn conv(in_ch: usize, out_ch: usize, k: usize, stride: usize) -> Result<Conv2d> {
    Conv2d::from_parts(
        init::kaiming_normal_fan_out(&[out_ch, in_ch, k, k])?,
        None,
        Conv2dConfig::default()
            .stride(stride)
            .padding(k / 2)
            .no_bias(),
    )
}

fn downsample(in_ch: usize, out_ch: usize, stride: usize) -> Result<Option<Sequential>> {
    if stride == 1 && in_ch == out_ch {
        return Ok(None);
    }
    Ok(Some(
        Sequential::new()
            .push(conv(in_ch, out_ch, 1, stride)?)
            .push(BatchNorm2d::new(out_ch)?),
    ))
}

/// The names of a block's convolutions and norms, by position in its branch.
const CONV_NAMES: [&str; 3] = ["conv1", "conv2", "conv3"];
const NORM_NAMES: [&str; 3] = ["bn1", "bn2", "bn3"];

/// `relu(branch(x) + shortcut(x))`, where the branch runs each `(conv, bn)` pair with `relu`
/// between pairs (not after the last) and the shortcut is `downsample` or the identity. Both
/// block kinds are this; they differ only in their pairs and in the order of their children.
fn residual_forward(
    pairs: &[(&Conv2d, &BatchNorm2d)],
    relu: &ReLU,
    downsample: Option<&Sequential>,
    x: &Tensor,
) -> Result<Tensor> {
    use crate::scope::{forward_in, forward_owned_in};
    let mut out = x.clone();
    for (i, (conv, bn)) in pairs.iter().enumerate() {
        out = forward_in(CONV_NAMES[i], *conv, &out)?;
        out = forward_in(NORM_NAMES[i], *bn, &out)?;
        if i + 1 < pairs.len() {
            out = forward_owned_in("relu", relu, out)?;
        }
    }
    let identity = match downsample {
        Some(d) => forward_in("downsample", d, x)?,
        None => x.clone(),
    };
    let sum = out.into_add(&identity)?;
    forward_owned_in("relu", relu, sum)
}

/// [`residual_forward`] for the tracer; pair `i` is traced as `conv{i+1}` and `bn{i+1}`.
fn residual_trace(
    t: &mut Tracer,
    pairs: &[(&Conv2d, &BatchNorm2d)],
    relu: &ReLU,
    downsample: Option<&Sequential>,
    x: &Act,
) -> Result<Act> {
    let mut out = x.clone();
    for (i, (conv, bn)) in pairs.iter().enumerate() {
        out = t.call(CONV_NAMES[i], *conv, &out)?;
        out = t.call(NORM_NAMES[i], *bn, &out)?;
        if i + 1 < pairs.len() {
            out = t.call("relu", relu, &out)?;
        }
    }
    let identity = match downsample {
        Some(d) => t.call("downsample", d, x)?,
        None => x.clone(),
    };
    let sum = t.output(&[&out, &identity], out.shape(), out.dtype(), false);
    t.call("relu", relu, &sum)
}

/// A block's children in registration order followed by `downsample` when present.
fn with_downsample<'a>(
    mut children: Vec<(String, &'a dyn Layer)>,
    downsample: &'a Option<Sequential>,
) -> Vec<(String, &'a dyn Layer)> {
    if let Some(d) = downsample {
        children.push(("downsample".into(), d));
    }
    children
}

/// [`with_downsample`] for mutable children.
fn with_downsample_mut<'a>(
    mut children: Vec<(String, &'a mut dyn Layer)>,
    downsample: &'a mut Option<Sequential>,
) -> Vec<(String, &'a mut dyn Layer)> {
    if let Some(d) = downsample {
        children.push(("downsample".into(), d));
    }
    children
}

/// The two-3x3-convolution residual block of ResNet-18/34 (expansion 1).
#[derive(Debug)]
pub struct BasicBlock {
    /// 3x3, carries the stride.
    pub conv1: Conv2d,
    /// After `conv1`.
    pub bn1: BatchNorm2d,
    /// Shared by both activations (called twice, as in torchvision).
    pub relu: ReLU,
    /// 3x3.
    pub conv2: Conv2d,
    /// After `conv2`.
    pub bn2: BatchNorm2d,
    /// 1x1 projection of the shortcut when the shape changes.
    pub downsample: Option<Sequential>,
    training: bool,
}

impl BasicBlock {
    /// Output channels per `planes` (torchvision's `expansion`).
    pub const EXPANSION: usize = 1;

    /// A block from `in_ch` to `planes` channels.
    pub fn new(in_ch: usize, planes: usize, stride: usize) -> Result<Self> {
        Ok(BasicBlock {
            conv1: conv(in_ch, planes, 3, stride)?,
            bn1: BatchNorm2d::new(planes)?,
            relu: ReLU::new(),
            conv2: conv(planes, planes, 3, 1)?,
            bn2: BatchNorm2d::new(planes)?,
            downsample: downsample(in_ch, planes, stride)?,
            training: true,
        })
    }
}

impl Module for BasicBlock {
    module_tree!();
}

impl Layer for BasicBlock {
    fn type_name(&self) -> &'static str {
        "BasicBlock"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let pairs = [(&self.conv1, &self.bn1), (&self.conv2, &self.bn2)];
        residual_forward(&pairs, &self.relu, self.downsample.as_ref(), x)
    }

    fn trace(&self, t: &mut Tracer, x: &Act) -> Result<Act> {
        let pairs = [(&self.conv1, &self.bn1), (&self.conv2, &self.bn2)];
        residual_trace(t, &pairs, &self.relu, self.downsample.as_ref(), x)
    }

    // torchvision registers `relu` right after `bn1` here (after `bn3` in `Bottleneck`).
    fn layers(&self) -> Vec<(String, &dyn Layer)> {
        let children: Vec<(String, &dyn Layer)> = vec![
            ("conv1".into(), &self.conv1),
            ("bn1".into(), &self.bn1),
            ("relu".into(), &self.relu),
            ("conv2".into(), &self.conv2),
            ("bn2".into(), &self.bn2),
        ];
        with_downsample(children, &self.downsample)
    }

    fn layers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        let children: Vec<(String, &mut dyn Layer)> = vec![
            ("conv1".into(), &mut self.conv1),
            ("bn1".into(), &mut self.bn1),
            ("relu".into(), &mut self.relu),
            ("conv2".into(), &mut self.conv2),
            ("bn2".into(), &mut self.bn2),
        ];
        with_downsample_mut(children, &mut self.downsample)
    }

    layer_casts!();
}

/// The 1x1-3x3-1x1 residual block of ResNet-50 (expansion 4, stride on the 3x3).
#[derive(Debug)]
pub struct Bottleneck {
    /// 1x1 reduce.
    pub conv1: Conv2d,
    /// After `conv1`.
    pub bn1: BatchNorm2d,
    /// 3x3, carries the stride.
    pub conv2: Conv2d,
    /// After `conv2`.
    pub bn2: BatchNorm2d,
    /// 1x1 expand.
    pub conv3: Conv2d,
    /// After `conv3`.
    pub bn3: BatchNorm2d,
    /// Shared by the three activations.
    pub relu: ReLU,
    /// 1x1 projection of the shortcut when the shape changes.
    pub downsample: Option<Sequential>,
    training: bool,
}

impl Bottleneck {
    /// Output channels per `planes` (torchvision's `expansion`).
    pub const EXPANSION: usize = 4;

    /// A block from `in_ch` to `planes * 4` channels.
    pub fn new(in_ch: usize, planes: usize, stride: usize) -> Result<Self> {
        let out_ch = planes * Self::EXPANSION;
        Ok(Bottleneck {
            conv1: conv(in_ch, planes, 1, 1)?,
            bn1: BatchNorm2d::new(planes)?,
            conv2: conv(planes, planes, 3, stride)?,
            bn2: BatchNorm2d::new(planes)?,
            conv3: conv(planes, out_ch, 1, 1)?,
            bn3: BatchNorm2d::new(out_ch)?,
            relu: ReLU::new(),
            downsample: downsample(in_ch, out_ch, stride)?,
            training: true,
        })
    }

    fn pairs(&self) -> [(&Conv2d, &BatchNorm2d); 3] {
        [
            (&self.conv1, &self.bn1),
            (&self.conv2, &self.bn2),
            (&self.conv3, &self.bn3),
        ]
    }
}

impl Module for Bottleneck {
    module_tree!();
}

impl Layer for Bottleneck {
    fn type_name(&self) -> &'static str {
        "Bottleneck"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        residual_forward(&self.pairs(), &self.relu, self.downsample.as_ref(), x)
    }

    fn trace(&self, t: &mut Tracer, x: &Act) -> Result<Act> {
        residual_trace(t, &self.pairs(), &self.relu, self.downsample.as_ref(), x)
    }

    fn layers(&self) -> Vec<(String, &dyn Layer)> {
        let children: Vec<(String, &dyn Layer)> = vec![
            ("conv1".into(), &self.conv1),
            ("bn1".into(), &self.bn1),
            ("conv2".into(), &self.conv2),
            ("bn2".into(), &self.bn2),
            ("conv3".into(), &self.conv3),
            ("bn3".into(), &self.bn3),
            ("relu".into(), &self.relu),
        ];
        with_downsample(children, &self.downsample)
    }

    fn layers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        let children: Vec<(String, &mut dyn Layer)> = vec![
            ("conv1".into(), &mut self.conv1),
            ("bn1".into(), &mut self.bn1),
            ("conv2".into(), &mut self.conv2),
            ("bn2".into(), &mut self.bn2),
            ("conv3".into(), &mut self.conv3),
            ("bn3".into(), &mut self.bn3),
            ("relu".into(), &mut self.relu),
        ];
        with_downsample_mut(children, &mut self.downsample)
    }

    layer_casts!();
}

/// The residual block kind of a ResNet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    /// Two 3x3 convolutions (ResNet-18/34).
    Basic,
    /// 1x1-3x3-1x1 with 4x expansion (ResNet-50/101/152).
    Bottleneck,
}

/// What to build: block kind, blocks per stage, classes and stem, at torchvision's 64 base
/// planes and RGB input ([`ResNetDims`] makes those two parameters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResNetConfig {
    /// Block kind.
    pub block: BlockKind,
    /// Blocks in `layer1`..`layer4`.
    pub layers: [usize; 4],
    /// Outputs of `fc`.
    pub num_classes: usize,
    /// CIFAR-style stem: 3x3 stride-1 `conv1`, no max-pool (for 32x32 inputs).
    pub small_input: bool,
}

/// The two dimensions torchvision fixes, as parameters: stage `i` (from 0) has `width << i`
/// planes and outputs `(width << i) * expansion` channels; the stem takes `in_channels`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResNetDims {
    /// Planes of `layer1` and output channels of the stem.
    pub width: usize,
    /// Channels of the input image (3 for RGB, 1 for grayscale).
    pub in_channels: usize,
}

impl ResNetDims {
    /// torchvision's: 64 base planes, RGB input.
    pub const TORCHVISION: ResNetDims = ResNetDims {
        width: 64,
        in_channels: 3,
    };
}

impl Default for ResNetDims {
    fn default() -> Self {
        Self::TORCHVISION
    }
}

/// torchvision's `ResNet`, with its width, input channels and stem as parameters.
#[derive(Debug)]
pub struct ResNet {
    /// Stem convolution (7x7 stride 2, or 3x3 stride 1 with the small-input stem).
    pub conv1: Conv2d,
    /// Stem norm.
    pub bn1: BatchNorm2d,
    /// Stem activation.
    pub relu: ReLU,
    /// 3x3 stride-2 max-pool (absent with the small-input stem).
    pub maxpool: Option<MaxPool2d>,
    /// Stages 1..4 (`width`, 2, 4 and 8 times `width` planes).
    pub stages: [Sequential; 4],
    /// Global average pool.
    pub avgpool: AdaptiveAvgPool2d,
    /// Classifier.
    pub fc: Linear,
    /// Block kind, depth, classes and stem.
    pub config: ResNetConfig,
    /// Width and input channels.
    pub dims: ResNetDims,
    training: bool,
}

const STAGE_NAMES: [&str; 4] = ["layer1", "layer2", "layer3", "layer4"];

impl ResNet {
    /// Builds a torchvision-sized ResNet (64 base planes, RGB input) from `config`.
    pub fn new(config: ResNetConfig) -> Result<Self> {
        Self::with_dims(config, ResNetDims::TORCHVISION)
    }

    /// Builds a ResNet of `config` with `dims`' width and input channels, weights drawn from
    /// kiln's default generator in registration order (seed it with
    /// `kiln_autograd::manual_seed` for a reproducible init).
    pub fn with_dims(config: ResNetConfig, dims: ResNetDims) -> Result<Self> {
        if dims.width == 0
            || dims.in_channels == 0
            || config.num_classes == 0
            || config.layers.contains(&0)
        {
            return Err(config_err(
                "ResNet",
                format!(
                    "width {}, in_channels {}, num_classes {} and blocks per stage {:?} must be \
                     positive",
                    dims.width, dims.in_channels, config.num_classes, config.layers
                ),
            ));
        }
        check_weights_fit(
            "ResNet",
            stage_weight_bytes(&config, &dims),
            format!(
                "width {} and blocks per stage {:?}",
                dims.width, config.layers
            ),
            "use fewer blocks or a smaller width",
        )?;
        let (conv1, maxpool) = if config.small_input {
            (conv(dims.in_channels, dims.width, 3, 1)?, None)
        } else {
            (
                conv(dims.in_channels, dims.width, 7, 2)?,
                Some(MaxPool2d::new(3, 2, 1)?),
            )
        };
        let expansion = match config.block {
            BlockKind::Basic => BasicBlock::EXPANSION,
            BlockKind::Bottleneck => Bottleneck::EXPANSION,
        };
        let mut in_ch = dims.width;
        let mut stages = Vec::with_capacity(STAGE_NAMES.len());
        for (i, &n) in config.layers.iter().enumerate() {
            // In range: `stage_weight_bytes` computed it checked.
            let planes = dims.width << i;
            let mut stage = Sequential::new();
            for b in 0..n {
                let stride = if b == 0 && i > 0 { 2 } else { 1 };
                stage = match config.block {
                    BlockKind::Basic => stage.push(BasicBlock::new(in_ch, planes, stride)?),
                    BlockKind::Bottleneck => stage.push(Bottleneck::new(in_ch, planes, stride)?),
                };
                in_ch = planes * expansion;
            }
            stages.push(stage);
        }
        let stages: [Sequential; 4] = stages.try_into().expect("four stages");
        Ok(ResNet {
            conv1,
            bn1: BatchNorm2d::new(dims.width)?,
            relu: ReLU::new(),
            maxpool,
            stages,
            avgpool: AdaptiveAvgPool2d::new([1, 1])?,
            fc: Linear::new(in_ch, config.num_classes, true)?,
            config,
            dims,
            training: true,
        })
    }
}

/// Bytes of the f32 weights of every block's 3x3 `planes -> planes` convolution (both block
/// kinds have one): a lower bound on the network's parameters. `None` when it overflows.
fn stage_weight_bytes(config: &ResNetConfig, dims: &ResNetDims) -> Option<usize> {
    config
        .layers
        .iter()
        .enumerate()
        .try_fold(0usize, |total, (i, &n)| {
            let planes = dims.width.checked_mul(1 << i)?;
            let per_block = f32_bytes(planes.checked_mul(planes)?, 9)?;
            total.checked_add(per_block.checked_mul(n)?)
        })
}

/// ResNet-18 (`BasicBlock`, `[2, 2, 2, 2]`).
pub fn resnet18(num_classes: usize) -> Result<ResNet> {
    ResNet::new(ResNetConfig {
        block: BlockKind::Basic,
        layers: [2, 2, 2, 2],
        num_classes,
        small_input: false,
    })
}

/// ResNet-34 (`BasicBlock`, `[3, 4, 6, 3]`).
pub fn resnet34(num_classes: usize) -> Result<ResNet> {
    ResNet::new(ResNetConfig {
        block: BlockKind::Basic,
        layers: [3, 4, 6, 3],
        num_classes,
        small_input: false,
    })
}

/// ResNet-50 (`Bottleneck`, `[3, 4, 6, 3]`).
pub fn resnet50(num_classes: usize) -> Result<ResNet> {
    ResNet::new(ResNetConfig {
        block: BlockKind::Bottleneck,
        layers: [3, 4, 6, 3],
        num_classes,
        small_input: false,
    })
}

impl Module for ResNet {
    module_tree!();
}

impl Layer for ResNet {
    fn type_name(&self) -> &'static str {
        "ResNet"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        use crate::scope::{forward_in, forward_owned_in};
        // The whole pass on kiln's CPU pool, not op by op.
        kiln_autograd::on_cpu_pool(x.device(), || {
            let h = forward_in("conv1", &self.conv1, x)?;
            let h = forward_in("bn1", &self.bn1, &h)?;
            let mut h = forward_owned_in("relu", &self.relu, h)?;
            if let Some(m) = &self.maxpool {
                h = forward_in("maxpool", m, &h)?;
            }
            for (name, s) in STAGE_NAMES.iter().zip(&self.stages) {
                h = forward_owned_in(name, s, h)?;
            }
            let h = forward_in("avgpool", &self.avgpool, &h)?.flatten(1, -1)?;
            forward_in("fc", &self.fc, &h)
        })
    }

    fn trace(&self, t: &mut Tracer, x: &Act) -> Result<Act> {
        let h = t.call("conv1", &self.conv1, x)?;
        let h = t.call("bn1", &self.bn1, &h)?;
        let mut h = t.call("relu", &self.relu, &h)?;
        if let Some(m) = &self.maxpool {
            h = t.call("maxpool", m, &h)?;
        }
        for (name, s) in STAGE_NAMES.iter().zip(&self.stages) {
            h = t.call(name, s, &h)?;
        }
        let h = t.call("avgpool", &self.avgpool, &h)?;
        let flat = t.view(&h, &[h.shape()[0], h.shape()[1]]);
        t.call("fc", &self.fc, &flat)
    }

    fn layers(&self) -> Vec<(String, &dyn Layer)> {
        let mut v: Vec<(String, &dyn Layer)> = vec![
            ("conv1".into(), &self.conv1),
            ("bn1".into(), &self.bn1),
            ("relu".into(), &self.relu),
        ];
        if let Some(m) = &self.maxpool {
            v.push(("maxpool".into(), m));
        }
        for (name, s) in STAGE_NAMES.iter().zip(&self.stages) {
            v.push((name.to_string(), s));
        }
        v.push(("avgpool".into(), &self.avgpool));
        v.push(("fc".into(), &self.fc));
        v
    }

    fn layers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        let mut v: Vec<(String, &mut dyn Layer)> = vec![
            ("conv1".into(), &mut self.conv1),
            ("bn1".into(), &mut self.bn1),
            ("relu".into(), &mut self.relu),
        ];
        if let Some(m) = &mut self.maxpool {
            v.push(("maxpool".into(), m));
        }
        for (name, s) in STAGE_NAMES.iter().zip(self.stages.iter_mut()) {
            v.push((name.to_string(), s));
        }
        v.push(("avgpool".into(), &mut self.avgpool));
        v.push(("fc".into(), &mut self.fc));
        v
    }

    layer_casts!();
}
