//! Built-in models with torchvision / PyTorch parameter names.

mod resnet;

pub use resnet::{
    resnet18, resnet34, resnet50, BasicBlock, BlockKind, Bottleneck, ResNet, ResNetConfig,
};
