//! The `MemoryBackend` trait: where the caching allocator gets raw memory from.
//!
//! A backend hands out *segments* (large raw ranges) and, optionally, *expandable* address-space
//! reservations into which physical pages are mapped on demand. It also abstracts streams and
//! events just enough for `record_stream` semantics: the allocator records an event on a stream
//! and later asks whether it has completed. Nothing here knows about blocks, pools or statistics.
//!
//! A CUDA backend (in `kiln-device`, over cudarc's driver API) fits this trait one-to-one:
//! - `reserve`/`release` = `cuMemAlloc`/`cuMemFree` with the device's context bound to the
//!   calling thread (the allocator calls from whichever thread missed).
//! - `capacity`/`free_bytes` = `cuMemGetInfo` (total, free).
//! - `page_size` = `cuMemGetAllocationGranularity(RECOMMENDED)` for a pinned-device
//!   `CUmemAllocationProp` (2 MiB today), or `None` when VMM is unsupported
//!   (`CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`).
//! - `reserve_address_space`/`release_address_space` = `cuMemAddressReserve`/`cuMemAddressFree`.
//! - `map` = per page `cuMemCreate` + `cuMemMap`, then one `cuMemSetAccess` (read-write for the
//!   device) over the range; keep the handles in a map from page address to handle, because
//!   `unmap` must be able to take any page-aligned sub-range: per page `cuMemUnmap` +
//!   `cuMemRelease`. On a failure part-way, unmap what was mapped and return the error.
//! - `remap` = per page `cuMemUnmap` at the old address and `cuMemMap` of the same handle at the
//!   new one, then one `cuMemSetAccess`: the physical pages move, none is created or released.
//! - `map_alias` / `unmap_alias` (optional) = `cuMemMap` of the same handles at a second address
//!   plus `cuMemSetAccess` / `cuMemUnmap` of that address only (kiln-device's `CudaBackend` does
//!   this wherever the device has VMM, and refuses to unmap or move a page while it has an alias).
//! - `record_event` = take an event from a pool (`cuEventCreate(DISABLE_TIMING)`) and
//!   `cuEventRecord` it on the stream (`StreamId` = the `CUstream` handle value, 0 = legacy
//!   default stream); `query_event` = `cuEventQuery` (`CUDA_ERROR_NOT_READY` -> `false`);
//!   `synchronize_event` = `cuEventSynchronize`; `destroy_event` returns it to the pool.
//! - `CUDA_ERROR_OUT_OF_MEMORY` maps to [`BackendError::OutOfMemory`] (so the allocator releases
//!   its cache and retries); every other driver error to [`BackendError::Driver`].

mod host;
#[cfg(target_os = "linux")]
mod host_pages;
mod sim;

pub use host::{HostBackend, DEFAULT_HOST_PAGE, MAX_HOST_PAGE};
pub use sim::{SimBackend, SimCalls};

/// A stream (an ordered queue of device work). `StreamId::DEFAULT` is the default stream; a CUDA
/// backend uses the `CUstream` handle value as the id. Host memory has only the default stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, serde::Serialize)]
pub struct StreamId(pub u64);

impl StreamId {
    /// The default (legacy/null) stream.
    pub const DEFAULT: StreamId = StreamId(0);
}

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// An event recorded on a stream by [`MemoryBackend::record_event`]; opaque to the allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventId(pub u64);

/// What a backend can report as a failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The device has no room for `requested` more bytes right now.
    #[error("backend out of memory: {requested} bytes requested, {free} bytes free")]
    OutOfMemory {
        /// Bytes asked for.
        requested: usize,
        /// Bytes the backend reported free at the time.
        free: usize,
    },
    /// The backend cannot do this (e.g. expandable segments on a backend without page mapping).
    #[error("backend `{backend}` does not support {what}")]
    Unsupported {
        /// The backend's name.
        backend: String,
        /// The missing capability.
        what: &'static str,
    },
    /// Any other driver failure, with the driver's message.
    #[error("backend failure: {0}")]
    Driver(String),
}

/// Raw memory for the [`CachingAllocator`](crate::CachingAllocator).
///
/// Addresses are `u64` so device pointers (`CUdeviceptr`) and host pointers both fit. All methods
/// take `&self`; implementations synchronise internally (the allocator calls them only on a cache
/// miss, while holding its own lock, so contention is not a concern).
pub trait MemoryBackend: Send + Sync {
    /// Short name used in reports, e.g. `"host"`, `"sim"`, `"cuda:0"`.
    fn name(&self) -> &str;

    /// Total bytes of memory the backend manages (device memory size, or a configured limit).
    fn capacity(&self) -> usize;

    /// Bytes the backend could still hand out right now.
    fn free_bytes(&self) -> usize;

    /// Reserves a physically backed segment of exactly `bytes` bytes and returns its address.
    /// The address is aligned to at least 512 bytes.
    fn reserve(&self, bytes: usize) -> Result<u64, BackendError>;

    /// Releases a segment obtained from [`reserve`](Self::reserve).
    ///
    /// # Safety
    /// `addr`/`bytes` must be exactly a live segment from `reserve`, and no pending or future
    /// access (host code or queued device work) may touch it.
    unsafe fn release(&self, addr: u64, bytes: usize) -> Result<(), BackendError>;

    /// The page size for expandable segments, or `None` when the backend cannot map pages into
    /// reserved address space (then expandable mode is refused at allocator construction).
    fn page_size(&self) -> Option<usize> {
        None
    }

    /// Reserves `bytes` (a multiple of the page size) of address space with no memory behind it.
    fn reserve_address_space(&self, bytes: usize) -> Result<u64, BackendError> {
        let _ = bytes;
        Err(BackendError::Unsupported {
            backend: self.name().to_string(),
            what: "address-space reservation",
        })
    }

    /// Releases an address-space reservation; every page in it must already be unmapped.
    ///
    /// # Safety
    /// `addr`/`bytes` must be exactly a reservation from
    /// [`reserve_address_space`](Self::reserve_address_space) with nothing mapped.
    unsafe fn release_address_space(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        let _ = (addr, bytes);
        Err(BackendError::Unsupported {
            backend: self.name().to_string(),
            what: "address-space reservation",
        })
    }

    /// Backs `[addr, addr + bytes)` (page-aligned, inside a reservation, currently unmapped) with
    /// physical pages. Each page must be unmappable on its own later (one handle per page).
    fn map(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        let _ = (addr, bytes);
        Err(BackendError::Unsupported {
            backend: self.name().to_string(),
            what: "page mapping",
        })
    }

    /// Unmaps `[addr, addr + bytes)` (page-aligned, currently mapped) and frees its pages.
    ///
    /// # Safety
    /// No pending or future access may touch the range.
    unsafe fn unmap(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        let _ = (addr, bytes);
        Err(BackendError::Unsupported {
            backend: self.name().to_string(),
            what: "page mapping",
        })
    }

    /// Moves the physical pages behind `[from, from + bytes)` (page-aligned, mapped) to
    /// `[to, to + bytes)` (page-aligned, inside a reservation, unmapped), page for page; `from`
    /// is unmapped afterwards. The memory held does not change (the caching allocator stitches
    /// free pages into a new range this way). What the pages held is not kept. The default
    /// unmaps, then maps: right for any backend, but it frees and allocates memory.
    ///
    /// # Safety
    /// No pending or future access may touch `[from, from + bytes)`.
    unsafe fn remap(&self, from: u64, to: u64, bytes: usize) -> Result<(), BackendError> {
        // SAFETY: forwarded contract.
        unsafe { self.unmap(from, bytes)? };
        self.map(to, bytes)
    }

    /// Whether [`map_alias`](Self::map_alias) and [`unmap_alias`](Self::unmap_alias) work: the
    /// memory of mapped pages can be mapped at a second address too (GMLake's multi-mapping,
    /// which lets page stitching keep stitched blocks cached).
    fn supports_aliases(&self) -> bool {
        false
    }

    /// Maps the memory already mapped at `[from, from + bytes)` (page-aligned) also at
    /// `[to, to + bytes)` (page-aligned, inside a reservation, unmapped), page for page. No memory
    /// is allocated: both addresses reach the same bytes until the alias is unmapped with
    /// [`unmap_alias`](Self::unmap_alias), which must happen before the pages at `from` are
    /// unmapped or moved.
    fn map_alias(&self, from: u64, to: u64, bytes: usize) -> Result<(), BackendError> {
        let _ = (from, to, bytes);
        Err(BackendError::Unsupported {
            backend: self.name().to_string(),
            what: "alias mappings",
        })
    }

    /// Removes an alias made by [`map_alias`](Self::map_alias) over exactly `[addr, addr +
    /// bytes)` of it (page-aligned); the memory stays mapped at its first address.
    ///
    /// # Safety
    /// No pending or future access may go through the alias addresses.
    unsafe fn unmap_alias(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        let _ = (addr, bytes);
        Err(BackendError::Unsupported {
            backend: self.name().to_string(),
            what: "alias mappings",
        })
    }

    /// Records an event on `stream` that completes when the work queued so far has finished.
    fn record_event(&self, stream: StreamId) -> Result<EventId, BackendError>;

    /// Whether `event` has completed. Never blocks.
    fn query_event(&self, event: EventId) -> Result<bool, BackendError>;

    /// Blocks until `event` has completed (used only by `empty_cache`/`trim_to`).
    fn synchronize_event(&self, event: EventId) -> Result<(), BackendError>;

    /// Returns `event` to the backend; the allocator never uses it again.
    fn destroy_event(&self, event: EventId);
}

/// A shared backend is a backend, so tests and tools can keep a handle to inspect it (for
/// example `Arc<SimBackend>` to read call counts) while the allocator owns a clone.
impl<T: MemoryBackend + ?Sized> MemoryBackend for std::sync::Arc<T> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn capacity(&self) -> usize {
        (**self).capacity()
    }
    fn free_bytes(&self) -> usize {
        (**self).free_bytes()
    }
    fn reserve(&self, bytes: usize) -> Result<u64, BackendError> {
        (**self).reserve(bytes)
    }
    unsafe fn release(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        // SAFETY: forwarded contract.
        unsafe { (**self).release(addr, bytes) }
    }
    fn page_size(&self) -> Option<usize> {
        (**self).page_size()
    }
    fn reserve_address_space(&self, bytes: usize) -> Result<u64, BackendError> {
        (**self).reserve_address_space(bytes)
    }
    unsafe fn release_address_space(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        // SAFETY: forwarded contract.
        unsafe { (**self).release_address_space(addr, bytes) }
    }
    fn map(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        (**self).map(addr, bytes)
    }
    unsafe fn unmap(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        // SAFETY: forwarded contract.
        unsafe { (**self).unmap(addr, bytes) }
    }
    unsafe fn remap(&self, from: u64, to: u64, bytes: usize) -> Result<(), BackendError> {
        // SAFETY: forwarded contract.
        unsafe { (**self).remap(from, to, bytes) }
    }
    fn supports_aliases(&self) -> bool {
        (**self).supports_aliases()
    }
    fn map_alias(&self, from: u64, to: u64, bytes: usize) -> Result<(), BackendError> {
        (**self).map_alias(from, to, bytes)
    }
    unsafe fn unmap_alias(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        // SAFETY: forwarded contract.
        unsafe { (**self).unmap_alias(addr, bytes) }
    }
    fn record_event(&self, stream: StreamId) -> Result<EventId, BackendError> {
        (**self).record_event(stream)
    }
    fn query_event(&self, event: EventId) -> Result<bool, BackendError> {
        (**self).query_event(event)
    }
    fn synchronize_event(&self, event: EventId) -> Result<(), BackendError> {
        (**self).synchronize_event(event)
    }
    fn destroy_event(&self, event: EventId) {
        (**self).destroy_event(event)
    }
}
