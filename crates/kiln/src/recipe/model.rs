//! [`SmallResNet`]: torchvision's ResNet layout (`conv1`, `bn1`, `layer1`..`layer4` of
//! kiln-models' `BasicBlock`s, `avgpool`, `fc`) with the CIFAR stem (3x3 stride-1 `conv1`, no
//! max-pool), a configurable base width and input channels. kiln-models' `ResNet` is fixed at
//! 64 base planes and 3 input channels; the training recipe needs a network small enough to
//! reach 90% on the synthetic set in minutes on two CPU cores, and MNIST's single channel.
//!
//! [`ModelConfig`] is everything needed to rebuild the network, so a checkpoint stores it as
//! JSON metadata and `predict` builds the same model before loading the weights.

use kiln_autograd::{Module, Tensor};
use kiln_models::layers::Sequential;
use kiln_models::layers::{AdaptiveAvgPool2d, BatchNorm2d, Conv2d, Conv2dConfig, Linear, ReLU};
use kiln_models::models::BasicBlock;
use kiln_models::{init, Act, Layer, Tracer};
use serde::{Deserialize, Serialize};

/// What [`SmallResNet::new`] builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Input channels (3 for RGB, 1 for MNIST).
    pub in_channels: usize,
    /// Input height and width.
    pub image_size: [usize; 2],
    /// Outputs of `fc`.
    pub num_classes: usize,
    /// Planes of `layer1`; each later stage doubles them (torchvision: 64).
    pub width: usize,
    /// `BasicBlock`s per stage (ResNet-18: `[2, 2, 2, 2]`).
    pub blocks: [usize; 4],
}

impl ModelConfig {
    /// The input shape `[C, H, W]`.
    pub fn input_shape(&self) -> [usize; 3] {
        [self.in_channels, self.image_size[0], self.image_size[1]]
    }
}

/// A ResNet with the CIFAR stem, configurable width (see the module docs).
#[derive(Debug)]
pub struct SmallResNet {
    /// 3x3 stride-1 stem convolution.
    pub conv1: Conv2d,
    /// Stem norm.
    pub bn1: BatchNorm2d,
    /// Stem activation.
    pub relu: ReLU,
    /// `layer1`..`layer4`.
    pub stages: [Sequential; 4],
    /// Global average pool.
    pub avgpool: AdaptiveAvgPool2d,
    /// The classifier head.
    pub fc: Linear,
    /// What was built.
    pub config: ModelConfig,
    training: bool,
}

const STAGES: [&str; 4] = ["layer1", "layer2", "layer3", "layer4"];

impl SmallResNet {
    /// Builds the network, weights drawn from kiln's default generator (seed it with
    /// `kiln_autograd::manual_seed` for a reproducible init).
    pub fn new(config: ModelConfig) -> kiln_models::Result<Self> {
        if config.width == 0 || config.num_classes == 0 || config.blocks.contains(&0) {
            return Err(kiln_models::Error::Config {
                what: "SmallResNet",
                msg: format!(
                    "width {}, num_classes {} and blocks {:?} must all be positive",
                    config.width, config.num_classes, config.blocks
                ),
            });
        }
        let w = config.width;
        let conv1 = Conv2d::from_parts(
            init::kaiming_normal_fan_out(&[w, config.in_channels, 3, 3])?,
            None,
            Conv2dConfig::default().stride(1).padding(1).no_bias(),
        )?;
        let mut in_ch = w;
        let mut stages = Vec::with_capacity(4);
        for (i, &n) in config.blocks.iter().enumerate() {
            let planes = w << i;
            let mut stage = Sequential::new();
            for b in 0..n {
                let stride = if b == 0 && i > 0 { 2 } else { 1 };
                stage = stage.push(BasicBlock::new(in_ch, planes, stride)?);
                in_ch = planes;
            }
            stages.push(stage);
        }
        Ok(SmallResNet {
            conv1,
            bn1: BatchNorm2d::new(w)?,
            relu: ReLU::new(),
            stages: stages.try_into().expect("four stages"),
            avgpool: AdaptiveAvgPool2d::new([1, 1])?,
            fc: Linear::new(in_ch, config.num_classes, true)?,
            config,
            training: true,
        })
    }
}

impl Module for SmallResNet {
    kiln_models::module_tree!();
}

impl Layer for SmallResNet {
    fn type_name(&self) -> &'static str {
        "ResNet"
    }

    fn forward(&self, x: &Tensor) -> kiln_models::Result<Tensor> {
        let mut h = self
            .relu
            .forward(&self.bn1.forward(&self.conv1.forward(x)?)?)?;
        for s in &self.stages {
            h = s.forward(&h)?;
        }
        let h = self.avgpool.forward(&h)?.flatten(1, -1)?;
        self.fc.forward(&h)
    }

    fn trace(&self, t: &mut Tracer, x: &Act) -> kiln_models::Result<Act> {
        let h = t.call("conv1", &self.conv1, x)?;
        let h = t.call("bn1", &self.bn1, &h)?;
        let mut h = t.call("relu", &self.relu, &h)?;
        for (name, s) in STAGES.iter().zip(&self.stages) {
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
        for (name, s) in STAGES.iter().zip(&self.stages) {
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
        for (name, s) in STAGES.iter().zip(self.stages.iter_mut()) {
            v.push((name.to_string(), s));
        }
        v.push(("avgpool".into(), &mut self.avgpool));
        v.push(("fc".into(), &mut self.fc));
        v
    }

    kiln_models::layer_casts!();
}
