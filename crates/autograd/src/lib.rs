//! `kiln-autograd`: tensors, views and reverse-mode automatic differentiation.
//!
//! This crate is filled by the tensor/autograd issue; every op reaches its kernel through the
//! backend seam in `kiln-device`. See `docs/ARCHITECTURE.md`.
