//! Freezing: choose which parameters train, by their dotted names.
//!
//! Freezing a parameter clears its `requires_grad` (and any gradient it holds), so backward does
//! not reach it, an optimizer built from [`Freeze::trainable_parameters`] keeps no state for it,
//! and layers whose parameters are all frozen and whose inputs need no gradient record nothing
//! for backward (which shrinks the saved activations: see `crate::plan`).

use crate::Result;
use kiln_autograd::{Module, Parameter};

/// Name-based freezing for every module.
pub trait Freeze {
    /// Freezes the parameters whose dotted name satisfies `select`
    /// (`freeze(|n| !n.starts_with("fc."))` keeps only the head trainable). Returns how many
    /// parameter tensors matched.
    fn freeze(&self, select: impl Fn(&str) -> bool) -> Result<usize>;

    /// Makes the parameters whose name satisfies `select` trainable again. Returns how many
    /// matched.
    fn unfreeze(&self, select: impl Fn(&str) -> bool) -> Result<usize>;

    /// The parameters that require grad, with their names: what an optimizer should get.
    fn trainable_parameters(&self) -> Vec<(String, Parameter)>;
}

impl<M: Module + ?Sized> Freeze for M {
    fn freeze(&self, select: impl Fn(&str) -> bool) -> Result<usize> {
        let mut n = 0;
        for (name, p) in self.named_parameters() {
            if select(&name) {
                p.set_requires_grad(false)?;
                p.set_grad(None)?;
                n += 1;
            }
        }
        Ok(n)
    }

    fn unfreeze(&self, select: impl Fn(&str) -> bool) -> Result<usize> {
        let mut n = 0;
        for (name, p) in self.named_parameters() {
            if select(&name) {
                p.set_requires_grad(true)?;
                n += 1;
            }
        }
        Ok(n)
    }

    fn trainable_parameters(&self) -> Vec<(String, Parameter)> {
        self.named_parameters()
            .into_iter()
            .filter(|(_, p)| p.requires_grad())
            .collect()
    }
}
