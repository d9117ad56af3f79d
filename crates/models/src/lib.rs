//! `kiln-models`: layers, ResNet / ViT / Transformer models with torchvision parameter names,
//! torchinfo-style summaries with memory planning, backbone freezing and checkpoints.
//!
//! - [`Layer`]: a `Module` with `forward` on tensors and `trace`, a shape-only forward that
//!   [`summary()`] and [`plan()`] run without allocating any tensor data.
//! - [`layers`]: `Linear`, `Conv2d`, `BatchNorm2d`, `LayerNorm`, `Embedding`, `Dropout`, `ReLU`,
//!   `Sigmoid`, `Tanh`, `SiLU`, `GELU`, pooling, `Flatten`, `Sequential`, `MultiheadAttention`,
//!   `TransformerEncoderLayer`.
//! - [`models`]: ResNet-18/34/50, ViT, a GPT-style decoder and an MLP, with PyTorch's names, so
//!   [`checkpoint`] files load in torchvision with `strict=True` and back.
//! - [`freeze`]: select trainable parameters by name.
//! - [`pth`]: PyTorch's own `torch.save` files (`.pth`), read without running their code;
//!   [`load_pth`] loads one into a model as [`load_safetensors`] does.
//!
//! ```
//! use kiln_models::{models::mlp, summary, Freeze, OptimizerKind};
//! let model = mlp(&[784, 256, 10], 0.0)?;
//! let s = summary(&model, &[32, 784])?;
//! assert_eq!(s.total_params, 203_530);
//! model.freeze(|name| name.starts_with("0."))?; // train only the head
//! assert_eq!(model.trainable_parameters().len(), 2);
//! let plan = kiln_models::plan(&model, &[784], kiln_autograd::DType::F32, OptimizerKind::AdamW)?;
//! assert!(plan.max_batch_size(1 << 30)? > 1000);
//! # Ok::<(), kiln_models::Error>(())
//! ```

pub mod checkpoint;
mod error;
mod fits;
pub mod freeze;
pub mod functional;
pub mod init;
mod layer;
pub mod layers;
pub mod models;
pub mod plan;
pub mod pth;
mod scope;
pub mod summary;
pub mod trace;

pub use checkpoint::{load_safetensors, save_safetensors, LoadReport};
pub use error::{Error, Result};
pub use freeze::Freeze;
pub use layer::{set_batch_stats_reduce, BatchStatsReduce, Layer, LayerExt};
pub use plan::{max_batch_size, parse_memory_size, plan, plan_on, MemoryPlan, OptimizerKind};
pub use pth::{load_pth, PthError};
pub use summary::{summary, summary_with_dtype, Summary};
pub use trace::{Act, LayerRecord, Tracer};
