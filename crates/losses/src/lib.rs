//! `kiln-losses`: loss functions with PyTorch's semantics and defaults, and errors that catch the
//! classic target mix-ups.
//!
//! - Classification: [`cross_entropy`] (class-index or class-probability targets, `weight`,
//!   `ignore_index`, `label_smoothing`), [`nll_loss`], [`one_hot`].
//! - Regression: [`mse_loss`], [`l1_loss`], [`smooth_l1_loss`], [`huber_loss`].
//! - Binary: [`binary_cross_entropy`], [`binary_cross_entropy_with_logits`].
//! - Distributions: [`kl_div`].
//!
//! `cross_entropy` runs one fused kernel (`kiln_device::ops::loss`) that computes the loss of
//! every position and its gradient in the same sweep over the logits, registered as one autograd
//! node (`CrossEntropyBackward`). The other losses are compositions of tensor ops, except the two
//! binary cross-entropies, which are single nodes with PyTorch's explicit gradient formulas (the
//! composed gradients differ at the clamped or non-differentiable points).
//!
//! Every loss checks the *form* of its target before computing anything (module `targets`): class
//! indices (integers, no class dim) for `cross_entropy`/`nll_loss`, values shaped like the input
//! for the elementwise losses. A one-hot matrix handed to `nll_loss`, an integer one-hot matrix
//! handed to `cross_entropy`, or class indices handed to `mse_loss` is an error that says which
//! form the loss wants and how to convert (`one_hot`, `argmax`, `to_dtype`). Class indices
//! outside `[0, C)` are reported with the first bad value and its position. Unlike PyTorch, the
//! elementwise losses do not broadcast a target of a different shape (PyTorch only warns, and
//! the result is nearly always wrong): they name both shapes.

mod binary;
mod classification;
mod error;
mod kl_div;
mod one_hot;
mod reduction;
mod regression;
mod targets;

pub use binary::{
    binary_cross_entropy, binary_cross_entropy_with_logits, BceOptions, BceWithLogitsOptions,
};
pub use classification::{cross_entropy, nll_loss, CrossEntropyOptions, NllLossOptions};
pub use error::{Error, Result};
pub use kl_div::{kl_div, KlDivReduction};
pub use one_hot::one_hot;
pub use reduction::Reduction;
pub use regression::{huber_loss, l1_loss, mse_loss, smooth_l1_loss};
