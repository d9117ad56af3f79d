//! Built-in models with torchvision / PyTorch parameter names, and [`by_name`] for tools.

mod gpt;
mod mlp;
mod resnet;
mod vit;

pub use gpt::{Gpt, GptConfig};
pub use mlp::mlp;
pub use resnet::{
    resnet18, resnet34, resnet50, BasicBlock, BlockKind, Bottleneck, ResNet, ResNetConfig,
    ResNetDims,
};
pub use vit::{Encoder, EncoderBlock, VisionTransformer, VitConfig};

use crate::error::config_err;
use crate::{Layer, Result};

/// Names accepted by [`by_name`].
pub const MODEL_NAMES: &[&str] = &[
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet18-cifar",
    "vit_b_16",
    "vit_tiny",
    "gpt2",
    "gpt_tiny",
    "mlp",
];

/// A built-in model by name (`resnet18`, `vit_b_16`, ...; see [`MODEL_NAMES`]) with
/// `num_classes` outputs where that applies.
pub fn by_name(name: &str, num_classes: usize) -> Result<Box<dyn Layer>> {
    Ok(match name {
        "resnet18" => Box::new(resnet18(num_classes)?),
        "resnet34" => Box::new(resnet34(num_classes)?),
        "resnet50" => Box::new(resnet50(num_classes)?),
        "resnet18-cifar" => Box::new(ResNet::new(ResNetConfig {
            block: BlockKind::Basic,
            layers: [2, 2, 2, 2],
            num_classes,
            small_input: true,
        })?),
        "vit_b_16" => Box::new(VisionTransformer::new(VitConfig::b16(num_classes))?),
        "vit_tiny" => Box::new(VisionTransformer::new(VitConfig::tiny(num_classes))?),
        "gpt2" => Box::new(Gpt::new(GptConfig::gpt2_small())?),
        "gpt_tiny" => Box::new(Gpt::new(GptConfig::tiny())?),
        "mlp" => Box::new(mlp(&[784, 256, num_classes], 0.0)?),
        other => {
            return Err(config_err(
                "model",
                format!(
                    "unknown model {other:?}; choose one of {}",
                    MODEL_NAMES.join(", ")
                ),
            ))
        }
    })
}
