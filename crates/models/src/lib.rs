//! `kiln-models`: layers, ResNet / ViT / Transformer models with torchvision parameter names,
//! torchinfo-style summaries with memory planning, backbone freezing and checkpoints.
//!
//! This crate is filled by the models issue. See `docs/ARCHITECTURE.md`.
