//! The layers: PyTorch's `torch.nn` building blocks with PyTorch's names and default inits.

mod activation;
mod attention;
mod conv;
mod embedding;
mod linear;
mod norm;
mod pool;
mod sequential;
mod transformer;

pub use activation::{Dropout, Flatten, Identity, ReLU, SiLU, Sigmoid, Tanh, GELU};
pub use attention::{AttentionMasks, MultiheadAttention};
pub use conv::{Conv2d, Conv2dConfig};
pub use embedding::Embedding;
pub use linear::Linear;
pub use norm::{BatchNorm2d, LayerNorm};
pub use pool::{AdaptiveAvgPool2d, AvgPool2d, MaxPool2d};
pub use sequential::Sequential;
pub use transformer::{Activation, TransformerEncoderLayer, TransformerEncoderLayerConfig};
