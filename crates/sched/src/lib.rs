//! `kiln-sched`: learning-rate schedulers that reproduce PyTorch's sequences over an optimizer's
//! parameter groups, plus scalar logging (TensorBoard event files, CSV, plots).
//!
//! This crate is filled by the scheduler issue. See `docs/ARCHITECTURE.md`.
