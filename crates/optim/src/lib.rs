//! `kiln-optim`: optimizers (SGD, Adam, AdamW) with parameter groups, fused gradient clipping by
//! global norm and AMP loss scaling.
//!
//! This crate is filled by the optimizer issue; it depends on `kiln-autograd` for parameters and
//! their gradients. See `docs/ARCHITECTURE.md` for where it sits in a training step.
