//! `kiln-models`: layers, ResNet / ViT / Transformer models with torchvision parameter names,
//! torchinfo-style summaries with memory planning, backbone freezing and checkpoints.
//!
//! - [`Layer`]: a `Module` with `forward` on tensors and `trace`, a shape-only forward that
//!   [`summary`] and [`plan`] run without allocating any tensor data.
//! - [`layers`]: `Linear`, `Conv2d`, `BatchNorm2d`, `LayerNorm`, `Embedding`, `Dropout`, `ReLU`,
//!   `GELU`, pooling, `Flatten`, `Sequential`, `MultiheadAttention`, `TransformerEncoderLayer`.
//! - [`models`]: ResNet-18/34/50, ViT, a GPT-style decoder and an MLP, with PyTorch's names, so
//!   [`checkpoint`] files load in torchvision with `strict=True` and back.
//! - [`freeze`]: select trainable parameters by name.

pub mod checkpoint;
mod error;
pub mod freeze;
pub mod functional;
pub mod init;
mod layer;
pub mod layers;
pub mod models;
pub mod plan;
pub mod summary;
pub mod trace;

pub use checkpoint::{load_safetensors, save_safetensors, LoadReport};
pub use error::{Error, Result};
pub use freeze::Freeze;
pub use layer::{Layer, LayerExt};
pub use plan::{max_batch_size, plan, MemoryPlan, OptimizerKind};
pub use summary::{summary, summary_with_dtype, Summary};
pub use trace::{Act, LayerRecord, Tracer};
