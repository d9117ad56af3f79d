//! The allocation-history scopes kiln-autograd opens (rules in kiln-alloc-cache's
//! `history.rs`): each forward op names itself (its node's name without `Backward`) and implies
//! `Activation` under grad mode, `Temporary` under `no_grad`; each backward node runs under its
//! own name, implying `Temporary`; leaf-gradient accumulation declares `Gradient`.
//!
//! Invariant: while no allocator records history every scope is one relaxed atomic load.

use super::profile::{forward_timer, ForwardTimer};
use kiln_device::{AllocContext, ContextGuard, MemoryCategory};

/// The scope of a forward op: its allocation-history scope and, while an
/// [`OpProfile`](super::profile::OpProfile) records, its timer (dropped first).
pub(crate) struct ForwardScope {
    _timer: ForwardTimer,
    _context: ContextGuard,
}

/// The scope of a forward op whose node is named `node_name` (`MmBackward` -> `Mm`).
#[inline]
pub(crate) fn forward_op(node_name: &'static str) -> ForwardScope {
    let timer = forward_timer(node_name);
    if !AllocContext::is_recording_anywhere() {
        return ForwardScope {
            _timer: timer,
            _context: AllocContext::op(node_name, MemoryCategory::Temporary),
        };
    }
    let implied = if super::grad_mode::is_grad_enabled() {
        MemoryCategory::Activation
    } else {
        MemoryCategory::Temporary
    };
    let name = node_name.strip_suffix("Backward").unwrap_or(node_name);
    ForwardScope {
        _timer: timer,
        _context: AllocContext::op(name, implied),
    }
}

/// The scope of backward node `node_name` while it runs.
#[inline]
pub(crate) fn backward_node(node_name: &'static str) -> ContextGuard {
    AllocContext::op(node_name, MemoryCategory::Temporary)
}
