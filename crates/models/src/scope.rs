//! The allocation-history scopes kiln-models opens (rules in kiln-alloc-cache's `history.rs`):
//! each container runs its children under their torchvision names, so what a child allocates
//! carries the module path (`layer3.1.conv2`); construction, `to_device` and loading declare
//! `Parameter`.
//!
//! Invariant: while no allocator records history a module scope is one relaxed atomic load
//! (no path is formatted).

use crate::{Layer, Result};
use kiln_autograd::Tensor;
use kiln_device::{AllocContext, ContextGuard, MemoryCategory};

/// Runs `layer.forward(x)` as the child module `name` of the current module path.
pub(crate) fn forward_in(name: &str, layer: &dyn Layer, x: &Tensor) -> Result<Tensor> {
    let _module = AllocContext::module(name);
    layer.forward(x)
}

/// Runs `layer.forward_owned(x)` as the child module `name` of the current module path (the
/// layer may write its result over `x`, which the caller gives up).
pub(crate) fn forward_owned_in(name: &str, layer: &dyn Layer, x: Tensor) -> Result<Tensor> {
    let _module = AllocContext::module(name);
    layer.forward_owned(x)
}

/// Enters the child module `name` until the guard drops (for children called through other
/// methods than `forward`).
pub(crate) fn module(name: &str) -> ContextGuard {
    AllocContext::module(name)
}

/// Declares that what is allocated until the guard drops is parameters (and buffers).
pub(crate) fn parameters() -> ContextGuard {
    AllocContext::category(MemoryCategory::Parameter)
}
