//! Built-in models with torchvision / PyTorch parameter names.

mod mlp;
mod resnet;

pub use mlp::mlp;
pub use resnet::{
    resnet18, resnet34, resnet50, BasicBlock, BlockKind, Bottleneck, ResNet, ResNetConfig,
};
