//! `kiln-alloc-cache`: the caching allocator through which every kiln tensor gets memory.
//!
//! - [`CachingAllocator`]: pools, best fit, splitting, coalescing, expandable segments, streams,
//!   the out-of-memory path and statistics (design notes at the top of `allocator.rs`).
//! - [`MemoryBackend`]: where segments come from: [`HostBackend`] (aligned host memory),
//!   [`SimBackend`] (a simulated device for tests and replay); the CUDA backend lives in
//!   `kiln-device`.
//! - [`Allocation`]: RAII handle (frees on drop); [`RawAllocation`] for explicit allocate/free.
//! - [`TraceRecorder`], [`Trace`] and [`replay()`]: record any run, replay it anywhere;
//!   [`pytorch_policy`] replays it under a model of PyTorch's allocator for comparison.
//! - [`planned`]: one steady step packed offline into an arena or into given bins (interval
//!   packing); with `planned_steps` and [`CachingAllocator::mark_step`], the allocator records
//!   a loop's step, packs it into its own free memory and serves the following steps from it,
//!   falling back to the cache when a step deviates (design notes in `planner.rs`).
//! - [`snapshot_pickle`] / [`snapshot_read`]: the allocation history and segments as the
//!   pickle PyTorch's memory_viz opens, and back ([`pickle`] is the codec).
//! - [`timeline`]: live bytes per category over time, the peak and its largest blocks (the
//!   data of kiln's memory picture).
//!
//! ```
//! use kiln_alloc_cache::{AllocatorConfig, CachingAllocator, HostBackend, StreamId};
//! use std::sync::Arc;
//! let alloc = Arc::new(CachingAllocator::new(HostBackend::new(), AllocatorConfig::default())?);
//! let a = alloc.allocate(1000, StreamId::DEFAULT)?;
//! assert_eq!(a.block_size(), 1024);
//! drop(a); // back to the cache, not to the system
//! assert_eq!(alloc.memory_stats().reserved_bytes.all.current, 2 << 20);
//! assert_eq!(alloc.empty_cache()?, 2 << 20);
//! # Ok::<(), kiln_alloc_cache::Error>(())
//! ```

mod allocator;
pub mod backend;
mod block;
mod config;
mod context;
mod error;
mod expandable;
mod free_index;
mod handle;
mod history;
mod lock;
mod oom_context;
mod page_runs;
pub mod pickle;
mod plan_dissolve;
mod plan_lend;
mod plan_state;
pub mod planned;
mod planner;
pub mod pytorch_policy;
mod recorded;
mod recorder;
pub mod replay;
mod replay_report;
mod ring;
mod segments;
mod sizes;
mod slab;
mod snapshot;
pub mod snapshot_pickle;
pub mod snapshot_read;
mod stats;
mod stitch;
mod stitched;
mod stitched_state;
pub mod synth;
pub mod timeline;
mod trace;

pub use allocator::{pool_for, segment_size_for, CachingAllocator};
pub use backend::{
    BackendError, EventId, HostBackend, MemoryBackend, SimBackend, SimCalls, StreamId,
    DEFAULT_HOST_PAGE, MAX_HOST_PAGE,
};
pub use config::AllocatorConfig;
pub use context::ContextGuard;
pub use error::{Error, OomReport, Result};
pub use handle::{Allocation, AllocatorRef, RawAllocation};
pub use history::{
    AllocContext, Attribution, CategoryBytes, LiveBlock, MemoryCategory, MemoryEvent,
    MemoryEventKind, PlanPrediction,
};
pub use plan_state::{StepThread, StepThreadGuard};
pub use recorded::MemoryHistory;
pub use replay::{
    replay, replay_stitched, replay_with, ReplayMode, ReplayPolicy, ReplayReport, Replayer,
};
pub use sizes::{
    round_size, GROWTH_DIVISOR, LARGE_SEGMENT, MAX_REQUEST, MIN_BLOCK, MIN_LARGE_ALLOC,
    ROUND_LARGE, SMALL_SEGMENT, SMALL_SIZE,
};
pub use snapshot::{BlockSnapshot, BlockSnapshotState, MemorySnapshot, SegmentSnapshot};
pub use stats::{format_bytes, MemoryStats, PoolKind, Stat, StatArray};
pub use trace::{compact_recording, Trace, TraceEvent, TraceRecorder};
