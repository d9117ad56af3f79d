//! Errors of `kiln-alloc-cache`, including the out-of-memory report.

use crate::backend::{BackendError, StreamId};
use crate::stats::{format_bytes, PoolKind};
use std::fmt;

/// Everything that can go wrong in `kiln-alloc-cache`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The request could not be satisfied even after releasing every cached segment; the report
    /// says how memory was used at that moment and what to do.
    #[error("{0}")]
    OutOfMemory(Box<OomReport>),
    /// The requested size cannot be allocated at all.
    #[error("invalid allocation size {requested} bytes: {reason}")]
    InvalidSize {
        /// Bytes asked for.
        requested: usize,
        /// Why it is refused and what to do instead.
        reason: &'static str,
    },
    /// A free of something this allocator did not hand out, or handed out and already freed.
    #[error("invalid free: {0}")]
    InvalidFree(String),
    /// An allocator setting is out of range or unsupported by the backend.
    #[error("invalid allocator configuration: {0}")]
    InvalidConfig(String),
    /// The backend failed for a reason other than running out of memory.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A trace file line could not be parsed or does not make sense.
    #[error("trace line {line}: {message}")]
    TraceParse {
        /// 1-based line number.
        line: usize,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// Reading or writing a trace file failed.
    #[error("trace file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The state of memory when an allocation failed: everything `Error::OutOfMemory` prints.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OomReport {
    /// The backend's name.
    pub backend: String,
    /// Bytes asked for.
    pub requested: usize,
    /// Bytes after rounding to the allocator's block size.
    pub rounded: usize,
    /// Stream of the request.
    pub stream: StreamId,
    /// Pool the request belongs to.
    pub pool: PoolKind,
    /// Backend capacity.
    pub capacity: usize,
    /// Bytes the backend reported free after the allocator released its cache.
    pub backend_free: usize,
    /// Bytes in blocks handed to callers.
    pub allocated: usize,
    /// Bytes the allocator holds from the backend.
    pub reserved: usize,
    /// `reserved - allocated`: cached, or split off inside segments that are partly in use.
    pub reserved_unallocated: usize,
    /// Largest free block the cache holds (any pool, any stream).
    pub largest_free_block: usize,
    /// `1 - largest_free_block / reserved_unallocated` (0 = all free memory in one block).
    pub fragmentation: f64,
    /// Whether expandable segments were on.
    pub expandable_segments: bool,
    /// Whether the backend can offer expandable segments at all (the host cannot: advice to
    /// turn them on is then never given).
    pub expandable_supported: bool,
    /// The smallest reservation the request needs (`rounded`, up to whole 2 MiB pages): when
    /// the backend counted at least this much free and still refused it, a limit outside the
    /// allocator (a process memory limit, the system's overcommit policy) said no.
    pub min_reservation: usize,
    /// Address space the request's pool asked for to start its expandable segment (the
    /// capacity with headroom), or 0 when it already had one or segments are fixed: a refusal
    /// then says that the address space, not the memory, was refused (`ulimit -v`).
    pub address_space: usize,
    /// The largest live blocks at the failure with what allocated them (empty when the
    /// allocation history was not being recorded).
    pub top_live: Vec<crate::history::LiveBlock>,
    /// Whether the allocation history was being recorded (else the report says how to).
    pub history_recorded: bool,
    /// What the registered memory plan predicted for this step, if one was registered.
    pub plan: Option<crate::history::PlanPrediction>,
}

impl fmt::Display for OomReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = |v: usize| format!("{} ({v} bytes)", format_bytes(v as i64));
        writeln!(
            f,
            "out of memory: tried to allocate {} on stream {} ({} pool, rounded to {} bytes).",
            b(self.requested),
            self.stream,
            self.pool.stat_name().trim_end_matches("_pool"),
            self.rounded
        )?;
        writeln!(
            f,
            "  {} backend: capacity {}, free {}.",
            self.backend,
            b(self.capacity),
            b(self.backend_free)
        )?;
        writeln!(
            f,
            "  kiln: allocated {}, reserved {}, reserved but unallocated {}.",
            b(self.allocated),
            b(self.reserved),
            b(self.reserved_unallocated)
        )?;
        writeln!(
            f,
            "  largest free block {}, fragmentation {:.1}% (1 - largest free / reserved-unallocated).",
            b(self.largest_free_block),
            self.fragmentation * 100.0
        )?;
        self.write_what_filled_it(f)?;
        write!(f, "  advice: ")?;
        let backend = &self.backend;
        if self.rounded > self.capacity {
            return write!(
                f,
                "this one request is larger than all the memory the {backend} backend has \
                 (capacity {}): the system refused {} bytes. No batch-size or allocator setting \
                 makes it fit: check the size that asked for it (a shape computed from input, a \
                 wrong unit), or split the work into pieces that fit.",
                b(self.capacity),
                self.requested
            );
        }
        if self.address_space > 0 && self.backend_free >= self.min_reservation {
            return write!(
                f,
                "the system refused to reserve {} bytes of address space for the {} pool's \
                 expandable segment (the capacity with headroom, so that holes never run it out \
                 of addresses; none of it is memory until pages are mapped): a process \
                 address-space limit (`ulimit -v`) is below that; raise it (`ulimit -v \
                 unlimited`), or turn expandable_segments off (fixed segments take address \
                 space only for the memory they hold).",
                self.address_space,
                match self.pool {
                    PoolKind::Small => "small",
                    PoolKind::Large => "large",
                }
            );
        }
        if self.backend_free >= self.min_reservation {
            return write!(
                f,
                "the system refused to reserve {} bytes although the {backend} backend counts {} \
                 free: a limit outside kiln stopped it (a process memory limit such as \
                 `ulimit -v` or a cgroup, or the system's overcommit policy); raise that limit \
                 or ask for less memory at once.",
                self.min_reservation,
                b(self.backend_free)
            );
        }
        let fragmented =
            self.reserved_unallocated.saturating_add(self.backend_free) >= self.rounded;
        if fragmented && !self.expandable_segments && self.expandable_supported {
            write!(
                f,
                "enough memory is free in total but not in one piece: turn on expandable \
                 segments (AllocatorConfig::expandable_segments, or \
                 KILN_ALLOC_CONF=expandable_segments:True) to stop fragmentation, or set \
                 max_split_size_mb so large blocks are not carved up; otherwise reduce the batch size."
            )
        } else if fragmented && !self.expandable_segments {
            write!(
                f,
                "enough memory is free in total but not in one piece: set max_split_size_mb \
                 (KILN_ALLOC_CONF=max_split_size_mb:N) so large blocks are not carved up, or call \
                 empty_cache between phases; otherwise reduce the batch size (the {backend} \
                 backend has no expandable segments)."
            )
        } else if fragmented {
            write!(
                f,
                "enough memory is free in total but not in one piece (free blocks of \
                 another stream or pool cannot be moved): reduce the batch size, or free \
                 long-lived tensors before this step."
            )
        } else {
            write!(
                f,
                "live tensors use the device: reduce the batch size (or sequence length), \
                 free tensors you no longer need, use activation checkpointing or mixed precision."
            )
        }
    }
}
