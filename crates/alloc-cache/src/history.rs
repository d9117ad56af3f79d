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
//!   - `Temporary` is implied by forward ops under `no_grad` and by everything backward
//!     computes (each node runs under an op scope with the node's name): input gradients in
//!     flight, scratch, and the optimizer step's out-of-place results.
//! - **Op**: the outermost op scope names it: the op the caller asked for (`matmul`, not the
//!   `bmm` it calls), or the backward node being run (`MmBackward`). Creation functions
//!   (`zeros`, `randn`, ...) open no op scope: they take the category around them.
//! - **Module path**: innermost wins; kiln-models' `Sequential`, ResNet, ViT and GPT blocks push
//!   their torchvision names as forward descends (`layer3.1.conv2`). Backward runs outside any
//!   module scope, so gradients and backward temporaries have no module path.
//! - The context is per thread: work a thread hands to another (a prefetching loader's worker)
//!   is attributed there only if it carries the context over ([`AllocContext::enter`]). Memory
//!   allocated before recording started is `Unknown` (it appears in `live_before`).
//! - Op and module scopes are free while no allocator records (one relaxed atomic load; no path
//!   is formatted), so their cost never reaches an unrecorded run.

use crate::backend::StreamId;
use crate::snapshot::MemorySnapshot;
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

    fn add(&mut self, category: MemoryCategory, bytes: usize) {
        self.bytes[category.index()] += bytes;
    }

    fn sub(&mut self, category: MemoryCategory, bytes: usize) {
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

/// What [`CachingAllocator::memory_history`](crate::CachingAllocator::memory_history) returns:
/// the events in the ring, what was dropped, and the state to rebuild segments and live blocks
/// at any event.
#[derive(Debug, Clone)]
pub struct MemoryHistory {
    /// Events in the order they happened (oldest first).
    pub events: Vec<MemoryEvent>,
    /// Events dropped from the front of the ring because it was full.
    pub dropped: u64,
    /// The ring's capacity.
    pub max_entries: usize,
    /// Whether recording is still on.
    pub recording: bool,
    /// Whether segment events are page maps / unmaps of expandable segments (PyTorch's
    /// `segment_map` / `segment_unmap`) rather than whole segments (`segment_alloc` / `free`).
    pub expandable_segments: bool,
    /// Blocks live just before the first event in `events` (those allocated before recording
    /// started, or by dropped events), sorted by address.
    pub live_before: Vec<LiveBlock>,
    /// Segments and blocks now (taken under the same lock as `events`; allocated blocks carry
    /// their attribution), from which earlier segment layouts follow by undoing events.
    pub snapshot: MemorySnapshot,
}

impl MemoryHistory {
    /// Replays the events from `live_before`, calling `visit(index, live)` after each event
    /// with the blocks live at that moment, by address.
    pub fn replay(
        &self,
        mut visit: impl FnMut(usize, &std::collections::BTreeMap<u64, LiveBlock>),
    ) {
        let mut live: std::collections::BTreeMap<u64, LiveBlock> = self
            .live_before
            .iter()
            .map(|b| (b.address, b.clone()))
            .collect();
        for (i, e) in self.events.iter().enumerate() {
            match e.kind {
                MemoryEventKind::Alloc => {
                    live.insert(
                        e.address,
                        LiveBlock {
                            address: e.address,
                            size: e.size,
                            stream: e.stream,
                            attribution: e.attribution.clone(),
                        },
                    );
                }
                MemoryEventKind::FreeRequested => {
                    live.remove(&e.address);
                }
                _ => {}
            }
            visit(i, &live);
        }
    }

    /// Live bytes per category right after each event (one entry per event).
    pub fn category_bytes(&self) -> Vec<CategoryBytes> {
        let mut now = CategoryBytes::default();
        for b in &self.live_before {
            now.add(b.attribution.category_or_unknown(), b.size);
        }
        let mut sizes: std::collections::HashMap<u64, (MemoryCategory, usize)> = self
            .live_before
            .iter()
            .map(|b| (b.address, (b.attribution.category_or_unknown(), b.size)))
            .collect();
        let mut out = Vec::with_capacity(self.events.len());
        for e in &self.events {
            match e.kind {
                MemoryEventKind::Alloc => {
                    let c = e.attribution.category_or_unknown();
                    now.add(c, e.size);
                    sizes.insert(e.address, (c, e.size));
                }
                MemoryEventKind::FreeRequested => {
                    if let Some((c, size)) = sizes.remove(&e.address) {
                        now.sub(c, size);
                    }
                }
                _ => {}
            }
            out.push(now);
        }
        out
    }

    /// The event at which `allocated_after` is largest (the first such) and the live bytes per
    /// category there; `None` without events.
    pub fn peak(&self) -> Option<(usize, CategoryBytes)> {
        let by_event = self.category_bytes();
        let (index, _) = self
            .events
            .iter()
            .enumerate()
            .rev()
            .max_by_key(|(_, e)| e.allocated_after)?;
        Some((index, by_event[index]))
    }

    /// Each category's largest live bytes over the events (each at its own moment).
    pub fn max_by_category(&self) -> CategoryBytes {
        self.category_bytes()
            .iter()
            .fold(CategoryBytes::default(), |acc, c| acc.max(c))
    }

    /// The history from event `index` on (a window such as one training step): its
    /// `live_before` is what was live just before that event. `index` past the end gives no
    /// events.
    pub fn since(&self, index: usize) -> MemoryHistory {
        let index = index.min(self.events.len());
        let mut live_before = match index {
            0 => self.live_before.clone(),
            i => self.live_at(i - 1),
        };
        live_before.sort_by_key(|b| b.address);
        MemoryHistory {
            events: self.events[index..].to_vec(),
            dropped: self.dropped + index as u64,
            live_before,
            ..self.clone()
        }
    }

    /// The blocks live right after event `index`, largest first.
    pub fn live_at(&self, index: usize) -> Vec<LiveBlock> {
        let mut out = Vec::new();
        self.replay(|i, live| {
            if i == index {
                out = live.values().cloned().collect();
            }
        });
        out.sort_by(|a, b| b.size.cmp(&a.size).then(a.address.cmp(&b.address)));
        out
    }
}
