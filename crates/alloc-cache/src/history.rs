//! Allocation history: a bounded record of what the allocator did and who asked for it, the
//! data behind `record_memory_history` / `dump_snapshot` (the format of PyTorch's
//! `torch.cuda.memory._record_memory_history` and `_dump_snapshot`) and kiln's memory pictures.
//!
//! Invariants:
//! - Recording is off by default; when off, the allocator's only cost is one test of a field it
//!   reads under its lock anyway (no atomic, no thread-local read) per allocate and free.
//! - Events are kept in a ring of at most `max_entries`; the oldest are dropped first and
//!   counted, never silently; the blocks a dropped event left live are folded into
//!   [`MemoryHistory::live_before`], so the ring always replays exactly.
//! - Every event carries the bytes allocated and reserved right after it, so a consumer can
//!   redraw the curves from the events alone; the per-category live bytes (the blocks of
//!   `live_before` plus the events' allocs less their `FreeRequested`) add up to
//!   `allocated_after` at every event, dropped events or not.
//! - Attribution (category, op, module path) is what the thread that allocated had declared in
//!   its [`AllocContext`] at that moment; memory nobody declared is [`MemoryCategory::Unknown`].
//!
//! # Which events
//!
//! `Alloc` when a block is handed out (its size is the block's, as `memory_allocated` counts
//! it); `FreeRequested` when its owner returns it (allocated bytes drop here) and
//! `FreeCompleted` when it can be reused (at once, or after the other streams that used it are
//! done); `SegmentAlloc` / `SegmentFree` when reserved bytes change: a fixed segment reserved or
//! released, or pages of an expandable segment mapped or unmapped (one event per run of pages;
//! [`MemoryHistory::expandable_segments`] says which); `Oom` when a request fails.
//!
//! A block whose owner changes while it lives (a gradient computed by backward and then kept as
//! a parameter's `.grad`) is recorded as its `FreeRequested` + `FreeCompleted` and a new `Alloc`
//! at the same address and time with the new attribution
//! ([`CachingAllocator::reattribute`](crate::CachingAllocator::reattribute)), so every
//! consumer of the events sees the category change and the sums stay exact.
//!
//! # Attribution rules (what kiln's crates declare, and their limits)
//!
//! - **Category**: the innermost category declared with [`AllocContext::category`] wins; without
//!   one, the category implied by the innermost op scope; without either, `Unknown`.
//!   - `Parameter`: kiln-models declares it around layer construction, `to_device` and
//!     checkpoint loading (buffers such as BatchNorm's running statistics count here too).
//!   - `Gradient`: kiln-autograd's engine declares it where a leaf's `.grad` is accumulated; a
//!     gradient that backward computed elsewhere and that becomes `.grad` as it is (no copy) is
//!     re-attributed at that moment (above).
//!   - `OptimizerState`: kiln-optim declares it where it creates state (momentum, Adam moments).
//!   - `Data`: kiln-data's `DataLoader` declares it while it assembles a batch.
//!   - `Activation` is implied by every forward op run under grad mode: *all* of its outputs,
//!     not only those autograd saves for backward. The approximation: an output that no backward
//!     reads (the input of a ReLU whose backward keeps only its output, say) counts as an
//!     activation until it is freed, which is usually at once (nothing holds it) — but the loss,
//!     the logits and the model's output also count here.
//!   - `Temporary` is implied by forward ops under `no_grad`, by anything else allocated under
//!     `no_grad` (kiln-autograd's guard implies it), and by everything backward computes (each
//!     node runs under an op scope with the node's name): input gradients in flight, scratch,
//!     and the optimizer step's out-of-place results.
//!   - `Unknown` is what is left: tensors created at top level under grad mode outside any
//!     scope (a batch made by hand rather than by the `DataLoader`), and the forward values of
//!     ops defined outside kiln-autograd's op files (kiln-losses computes its outputs before it
//!     records them, so they carry no op scope).
//! - **Op**: the outermost op scope names it: the op the caller asked for (`Mm` for `matmul`,
//!   not the ops it calls; forward ops are named by their node without `Backward`), or the
//!   backward node being run (`MmBackward`). Creation functions (`zeros`, `randn`, ...) and
//!   views open no op scope: they take the category around them.
//! - **Sizes** are block sizes (what `memory_allocated` counts): a tensor's bytes rounded up to
//!   512, and for blocks over 256 KiB possibly up to 256 KiB more (a cached block's tail that the
//!   large pool does not split off), so a category can exceed the tensor bytes a plan counts.
//! - **Module path**: innermost wins; kiln-models' `Sequential`, ResNet, ViT and GPT blocks push
//!   their torchvision names as forward descends (`layer3.1.conv2`). Backward runs outside any
//!   module scope, so gradients and backward temporaries have no module path.
//! - The context is per thread: work a thread hands to another (a prefetching loader's worker)
//!   is attributed there only if it carries the context over ([`AllocContext::enter`]). Memory
//!   allocated before recording started is `Unknown` (it appears in `live_before`).
//! - Op and module scopes are free while no allocator records (one relaxed atomic load; no path
//!   is formatted), so their cost never reaches an unrecorded run.

use crate::backend::StreamId;
use std::sync::Arc;

/// What an allocation is for (the stack order of kiln's memory picture).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
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
/// optimizer inside it). The scope API is in `context.rs`; the names below are the contract.
#[derive(Debug, Clone, Default)]
pub struct AllocContext {
    /// The declared category.
    pub category: Option<MemoryCategory>,
    /// The declared op.
    pub op: Option<Arc<str>>,
    /// The declared module path.
    pub module: Option<Arc<str>>,
}

impl MemoryCategory {
    /// Every category, in the stack order of kiln's memory picture.
    pub const ALL: [MemoryCategory; 7] = [
        MemoryCategory::Parameter,
        MemoryCategory::Gradient,
        MemoryCategory::OptimizerState,
        MemoryCategory::Activation,
        MemoryCategory::Temporary,
        MemoryCategory::Data,
        MemoryCategory::Unknown,
    ];

    /// Position in [`MemoryCategory::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Lower-case name (`optimizer_state`), as reports and files write it.
    pub fn name(self) -> &'static str {
        match self {
            MemoryCategory::Parameter => "parameter",
            MemoryCategory::Gradient => "gradient",
            MemoryCategory::OptimizerState => "optimizer_state",
            MemoryCategory::Activation => "activation",
            MemoryCategory::Temporary => "temporary",
            MemoryCategory::Data => "data",
            MemoryCategory::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for MemoryCategory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Attribution {
    /// The category, `Unknown` when none was declared.
    pub fn category_or_unknown(&self) -> MemoryCategory {
        self.category.unwrap_or(MemoryCategory::Unknown)
    }
}

impl serde::Serialize for Attribution {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut out = s.serialize_struct("Attribution", 3)?;
        out.serialize_field("category", &self.category_or_unknown())?;
        out.serialize_field("op", &self.op.as_deref())?;
        out.serialize_field("module", &self.module.as_deref())?;
        out.end()
    }
}

/// A block that was live (allocated) at some moment, with its attribution.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LiveBlock {
    /// First byte.
    pub address: u64,
    /// Bytes of the block.
    pub size: usize,
    /// The stream it belongs to.
    pub stream: StreamId,
    /// Who asked for it (`Unknown` when it was allocated before recording started).
    pub attribution: Attribution,
}

/// Live bytes per category at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CategoryBytes {
    bytes: [usize; 7],
}

impl CategoryBytes {
    /// Bytes of `category`.
    pub fn get(&self, category: MemoryCategory) -> usize {
        self.bytes[category.index()]
    }

    /// Sum over the categories.
    pub fn total(&self) -> usize {
        self.bytes.iter().sum()
    }

    /// `(category, bytes)` in the order of [`MemoryCategory::ALL`].
    pub fn iter(&self) -> impl Iterator<Item = (MemoryCategory, usize)> + '_ {
        MemoryCategory::ALL.iter().map(|&c| (c, self.get(c)))
    }

    pub(crate) fn add(&mut self, category: MemoryCategory, bytes: usize) {
        self.bytes[category.index()] += bytes;
    }

    pub(crate) fn sub(&mut self, category: MemoryCategory, bytes: usize) {
        let slot = &mut self.bytes[category.index()];
        *slot = slot.saturating_sub(bytes);
    }

    /// Each category's larger value of `self` and `other`.
    pub fn max(&self, other: &CategoryBytes) -> CategoryBytes {
        let mut out = *self;
        for (o, b) in out.bytes.iter_mut().zip(other.bytes) {
            *o = (*o).max(b);
        }
        out
    }
}

/// What a memory plan predicted for one step (registered with
/// [`CachingAllocator::set_plan_prediction`](crate::CachingAllocator::set_plan_prediction);
/// the out-of-memory report prints it next to what was live).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PlanPrediction {
    /// What was planned (`AdamW step, batch 256`).
    pub label: String,
    /// Predicted peak of allocated bytes.
    pub peak_allocated: usize,
    /// Predicted bytes by category (those the plan names).
    pub by_category: Vec<(MemoryCategory, usize)>,
}

impl PlanPrediction {
    /// Predicted bytes of `category`, if the plan names it.
    pub fn category_bytes(&self, category: MemoryCategory) -> Option<usize> {
        self.by_category
            .iter()
            .find(|(c, _)| *c == category)
            .map(|&(_, b)| b)
    }
}
