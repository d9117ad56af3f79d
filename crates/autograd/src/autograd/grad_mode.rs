//! Grad mode: whether ops record the graph, per thread (PyTorch's `torch.no_grad`).
//!
//! Under [`no_grad`] an op records no node and saves no tensor, so a forward pass holds only its
//! parameters and outputs. Guards restore the previous mode when dropped, so they nest; they are
//! `!Send` because the mode belongs to the thread that set it.

use std::cell::Cell;
use std::marker::PhantomData;

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// True when ops on this thread record the autograd graph.
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(|g| g.get())
}

/// Sets this thread's grad mode and returns the previous one (the guards here, and
/// `cpu_pool.rs`, which restores it itself).
pub(crate) fn set_grad_enabled(enabled: bool) -> bool {
    GRAD_ENABLED.with(|g| g.replace(enabled))
}

/// Disables graph recording on this thread until dropped (then restores the previous mode).
#[must_use = "grad mode is restored as soon as the guard is dropped"]
pub struct NoGradGuard {
    previous: bool,
    /// What is allocated under `no_grad` without a declared category is a temporary (the
    /// allocation history's rule).
    _temporary: kiln_device::ContextGuard,
    _not_send: PhantomData<*const ()>,
}

impl NoGradGuard {
    /// Turns recording off.
    pub fn new() -> Self {
        NoGradGuard {
            previous: set_grad_enabled(false),
            _temporary: kiln_device::AllocContext::default_category(
                kiln_device::MemoryCategory::Temporary,
            ),
            _not_send: PhantomData,
        }
    }
}

impl Default for NoGradGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        set_grad_enabled(self.previous);
    }
}

/// Enables graph recording on this thread until dropped (inside a `no_grad` region).
#[must_use = "grad mode is restored as soon as the guard is dropped"]
pub struct EnableGradGuard {
    previous: bool,
    _not_send: PhantomData<*const ()>,
}

impl EnableGradGuard {
    /// Turns recording on.
    pub fn new() -> Self {
        EnableGradGuard {
            previous: set_grad_enabled(true),
            _not_send: PhantomData,
        }
    }
}

impl Default for EnableGradGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for EnableGradGuard {
    fn drop(&mut self) {
        set_grad_enabled(self.previous);
    }
}

/// Runs `f` with graph recording off.
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    let _guard = NoGradGuard::new();
    f()
}

/// Runs `f` with graph recording on.
pub fn enable_grad<R>(f: impl FnOnce() -> R) -> R {
    let _guard = EnableGradGuard::new();
    f()
}
