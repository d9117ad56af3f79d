//! Handles to allocated blocks: [`RawAllocation`] for the explicit allocate/free API and the
//! RAII [`Allocation`] that tensor storage is built on.

use crate::allocator::CachingAllocator;
use crate::backend::StreamId;
use crate::error::Result;
use std::sync::Arc;

/// A live block from [`CachingAllocator::allocate_raw`]. Not `Clone`: it must be given back
/// exactly once with [`CachingAllocator::free_raw`] (dropping it leaks the block until the
/// allocator is dropped). It carries the block's slab index, so a free needs no lookup.
#[derive(Debug, PartialEq, Eq)]
pub struct RawAllocation {
    pub(crate) addr: u64,
    pub(crate) size: usize,
    pub(crate) block_size: usize,
    pub(crate) stream: StreamId,
    pub(crate) slot: u32,
    pub(crate) owner: u32,
    pub(crate) alloc_id: u64,
}

impl RawAllocation {
    /// Address of the first byte (device address, or host address for host backends).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The address as a pointer; dereferenceable only for host backends.
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr as usize as *mut u8
    }

    /// Bytes requested.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Bytes of the block (the request rounded up; at least `size`).
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Stream the block was allocated on.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// Unique id of this allocation (the id used in traces).
    pub fn id(&self) -> u64 {
        self.alloc_id
    }
}

/// How an [`Allocation`] reaches its allocator: a shared reference count, or a `'static`
/// allocator (a process-wide per-device one) that needs no reference counting at all.
#[derive(Debug, Clone)]
pub enum AllocatorRef {
    /// Shared ownership; the allocator lives while any handle does.
    Shared(Arc<CachingAllocator>),
    /// An allocator that is never dropped; saves two atomic operations per allocation.
    Static(&'static CachingAllocator),
}

impl std::ops::Deref for AllocatorRef {
    type Target = CachingAllocator;
    fn deref(&self) -> &CachingAllocator {
        match self {
            AllocatorRef::Shared(a) => a,
            AllocatorRef::Static(a) => a,
        }
    }
}

/// An allocated block that returns itself to its allocator when dropped.
#[derive(Debug)]
pub struct Allocation {
    allocator: AllocatorRef,
    raw: Option<RawAllocation>,
}

impl Allocation {
    pub(crate) fn new(allocator: AllocatorRef, raw: RawAllocation) -> Self {
        Self {
            allocator,
            raw: Some(raw),
        }
    }

    fn raw(&self) -> &RawAllocation {
        self.raw
            .as_ref()
            .expect("an Allocation holds its block until dropped")
    }

    /// Address of the first byte.
    pub fn addr(&self) -> u64 {
        self.raw().addr
    }

    /// The address as a pointer; dereferenceable only for host backends.
    pub fn as_ptr(&self) -> *mut u8 {
        self.raw().as_ptr()
    }

    /// Bytes requested.
    pub fn size(&self) -> usize {
        self.raw().size
    }

    /// Bytes of the block (at least `size`).
    pub fn block_size(&self) -> usize {
        self.raw().block_size
    }

    /// Stream the block was allocated on.
    pub fn stream(&self) -> StreamId {
        self.raw().stream
    }

    /// Unique id of this allocation (the id used in traces).
    pub fn id(&self) -> u64 {
        self.raw().alloc_id
    }

    /// The allocator this block came from.
    pub fn allocator(&self) -> &AllocatorRef {
        &self.allocator
    }

    /// Marks the block as used by work on `stream` (see [`CachingAllocator::record_stream`]).
    pub fn record_stream(&self, stream: StreamId) -> Result<()> {
        self.allocator.record_stream(self.raw(), stream)
    }

    /// Gives up ownership without freeing; free the result with [`CachingAllocator::free_raw`].
    pub fn into_raw(mut self) -> RawAllocation {
        self.raw
            .take()
            .expect("an Allocation holds its block until dropped")
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if let Some(raw) = self.raw.take() {
            // Cannot fail: the handle is the only owner of a live block of this allocator.
            let freed = self.allocator.free_raw(raw);
            debug_assert!(freed.is_ok(), "{freed:?}");
        }
    }
}
