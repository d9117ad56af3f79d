//! The recipe's network: kiln-models' [`ResNet`] of `BasicBlock`s with the CIFAR stem (3x3
//! stride-1 `conv1`, no max-pool), sized by [`ModelConfig`]. Its base width and input channels
//! are parameters because the recipe needs a network small enough to reach 90% on the
//! synthetic set in minutes on two CPU cores, and MNIST's single channel.
//!
//! [`ModelConfig`] is everything needed to rebuild the network, so a checkpoint stores it as
//! JSON metadata (`kiln.model_config`; its fields are that file format) and `predict` builds the
//! same model before loading the weights.

use kiln_models::models::{BlockKind, ResNet, ResNetConfig, ResNetDims};
use serde::{Deserialize, Serialize};

/// What [`ModelConfig::build`] builds.
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

    /// Builds the network (`BasicBlock`s, small-input stem), weights drawn from kiln's
    /// default generator (seed it with `kiln_autograd::manual_seed` for a reproducible init).
    pub fn build(&self) -> kiln_models::Result<ResNet> {
        let config = ResNetConfig {
            block: BlockKind::Basic,
            layers: self.blocks,
            num_classes: self.num_classes,
            small_input: true,
        };
        let dims = ResNetDims {
            width: self.width,
            in_channels: self.in_channels,
        };
        ResNet::with_dims(config, dims)
    }
}

/// True for the parameters of the classifier head (`fc.*`): what trains while the backbone is
/// frozen, and the optimizer's second parameter group.
pub(super) fn is_head(name: &str) -> bool {
    name.starts_with("fc.")
}
