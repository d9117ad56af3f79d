//! `kiln-losses`: loss functions (cross-entropy on class indices, MSE, one-hot via scatter, ...)
//! with errors that catch the classic one-hot / class-index mix-ups.
//!
//! This crate is filled by the losses issue. See `docs/ARCHITECTURE.md`.
