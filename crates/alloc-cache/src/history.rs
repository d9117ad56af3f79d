//! Allocation history: a bounded record of what the allocator did and who asked for it, the
//! data behind `record_memory_history` / `dump_snapshot` (the format of PyTorch's
//! `torch.cuda.memory._record_memory_history` and `_dump_snapshot`) and kiln's memory pictures.
//!
//! Invariants:
//! - Recording is off by default; when off, the allocator's only cost is one relaxed atomic load
//!   per call.
//! - Events are kept in a ring of at most `max_entries`; the oldest are dropped first and
//!   counted, never silently.
//! - Every event carries the bytes allocated and reserved right after it, so a consumer can
//!   redraw the curves from the events alone; the per-category live bytes of the events still
//!   in the ring add up to `allocated_after` whenever no event was dropped.
//! - Attribution (category, op, module path) is what the thread that allocated had declared in
//!   its [`AllocContext`] at that moment; memory nobody declared is [`MemoryCategory::Unknown`].

use crate::backend::StreamId;
use std::sync::Arc;

/// What an allocation is for (the stack order of kiln's memory picture).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemoryCategory {
    /// Model parameters and buffers.
    Parameter,
    /// Gradients of parameters.
    Gradient,
    /// Optimizer state (momentum, Adam moments).
    OptimizerState,
    /// Activations saved for backward.
    Activation,
    /// Short-lived results and scratch.
    Temporary,
    /// Input batches and targets.
    Data,
    /// Not declared by any context.
    Unknown,
}

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryEventKind {
    /// A block was handed out (PyTorch's `alloc`).
    Alloc,
    /// A block was returned by its owner; it may still wait for other streams (`free_requested`).
    FreeRequested,
    /// A block became free for reuse (`free_completed`).
    FreeCompleted,
    /// Memory was obtained from the backend (`segment_alloc`, or `segment_map` when expandable).
    SegmentAlloc,
    /// Memory was given back to the backend (`segment_free`, or `segment_unmap`).
    SegmentFree,
    /// A request failed after every retry (`oom`); `size` is the request.
    Oom,
}

/// Who asked: what the allocating thread declared in its [`AllocContext`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attribution {
    /// The category (`Unknown` when nothing was declared).
    pub category: Option<MemoryCategory>,
    /// The op, as autograd names its node (`ConvolutionBackward`, `add`, ...).
    pub op: Option<Arc<str>>,
    /// The module path (`layer3.1.conv2`).
    pub module: Option<Arc<str>>,
}

/// One event of the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryEvent {
    /// What happened.
    pub kind: MemoryEventKind,
    /// First byte of the block or segment.
    pub address: u64,
    /// Bytes of the block or segment (the request, for `Oom`).
    pub size: usize,
    /// The stream the block belongs to.
    pub stream: StreamId,
    /// Microseconds since the history was enabled.
    pub time_us: u64,
    /// Who asked.
    pub attribution: Attribution,
    /// Bytes in allocated blocks right after the event.
    pub allocated_after: usize,
    /// Bytes reserved from the backend right after the event.
    pub reserved_after: usize,
}

/// The thread-local declaration the allocator reads when it records an event. Scopes nest:
/// the innermost declared field wins (a module path set by the model, a category set by the
/// optimizer inside it). Implemented in this file; the names below are the contract.
#[derive(Debug, Clone, Default)]
pub struct AllocContext {
    /// The declared category.
    pub category: Option<MemoryCategory>,
    /// The declared op.
    pub op: Option<Arc<str>>,
    /// The declared module path.
    pub module: Option<Arc<str>>,
}
