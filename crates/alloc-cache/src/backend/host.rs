//! `HostBackend`: segments of ordinary, page-aligned host memory (for CPU tensors).
//!
//! Segments of 2 MiB or more are aligned to 2 MiB and, on Linux, advised to use transparent huge
//! pages (`madvise(MADV_HUGEPAGE)`): a cached buffer is then reached through a few TLB entries
//! instead of one per 4 KiB page, which is most of the cost of touching a large warm buffer.
//!
//! Segments are zero-filled when reserved, so every byte of host memory the allocator hands out
//! is initialised (zeros, or whatever an earlier block owner wrote).
//!
//! Host work is synchronous, so every event is complete the moment it is recorded. Expandable
//! segments (and page stitching) are offered on Linux when asked for
//! ([`HostBackend::with_page_mapping`]): pages of a `memfd` mapped into `PROT_NONE`
//! reservations (`host_pages.rs`). By default they are not: the cache already keeps the
//! page-faulted memory warm, which is what matters most on the host; and the pages are shared
//! memory, so a child made by `fork` while they are mapped writes the same bytes as its parent,
//! where the private memory of fixed segments is copied on write.
//!
//! The page of expandable segments is [`DEFAULT_HOST_PAGE`] = 64 KiB unless another is asked
//! for. CUDA's is fixed at 2 MiB; on the host any multiple of the system page works, and a
//! smaller page lets reserved memory follow live memory more closely: with page stitching,
//! every shipped trace stays within 1.03x its peak of live bytes at 64 KiB, where at 2 MiB the
//! CPU-scale ones (peaks of 100-350 MiB) reach 1.095 (`docs/ARCHITECTURE.md`, "Page size").
//! Each page could become a kernel mapping of its own, and the kernel caps those per process
//! (`vm.max_map_count`); in practice ranges are mapped in runs of consecutive memfd slots,
//! which the kernel keeps as one mapping, and the recorded traces add at most a few hundred.
//! Reaching the cap is reported as such, with both fixes, not as running out of memory.

use super::{BackendError, EventId, MemoryBackend, StreamId};
use std::alloc::Layout;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Page of host expandable segments unless another is asked for
/// ([`HostBackend::with_page_mapping_of`]).
pub const DEFAULT_HOST_PAGE: usize = 64 << 10;
/// Largest page of host expandable segments.
pub const MAX_HOST_PAGE: usize = 1 << 30;

/// Alignment of host segments under 2 MiB: one 4 KiB page (blocks inside are 512-byte aligned).
pub const HOST_SEGMENT_ALIGN: usize = 4096;
/// Alignment (and huge-page size) of host segments of 2 MiB or more.
pub const HOST_HUGE_ALIGN: usize = 2 << 20;

fn segment_layout(bytes: usize) -> Option<Layout> {
    let align = if bytes >= HOST_HUGE_ALIGN {
        HOST_HUGE_ALIGN
    } else {
        HOST_SEGMENT_ALIGN
    };
    Layout::from_size_align(bytes, align).ok()
}

#[cfg(target_os = "linux")]
fn advise_huge_pages(ptr: *mut u8, bytes: usize) {
    extern "C" {
        fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
    }
    const MADV_HUGEPAGE: i32 = 14;
    if bytes >= HOST_HUGE_ALIGN {
        // SAFETY: `ptr..ptr + bytes` is a live allocation we own; the advice only changes how
        // the kernel backs it (failure, e.g. THP disabled, is harmless and ignored).
        unsafe {
            madvise(
                ptr.cast(),
                bytes / HOST_HUGE_ALIGN * HOST_HUGE_ALIGN,
                MADV_HUGEPAGE,
            )
        };
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_ptr: *mut u8, _bytes: usize) {}

/// Aligned host memory from the global allocator, with an optional byte limit.
#[derive(Debug)]
pub struct HostBackend {
    capacity: usize,
    /// Bytes held: segments plus mapped pages.
    reserved: AtomicUsize,
    #[cfg(target_os = "linux")]
    pages: Option<super::host_pages::HostPages>,
}

impl HostBackend {
    /// A backend limited by the machine's physical memory (`MemTotal` on Linux; unlimited if
    /// that cannot be read).
    pub fn new() -> Self {
        Self::with_capacity(physical_memory().unwrap_or(usize::MAX / 2))
    }

    /// A backend that refuses to hold more than `capacity` bytes in segments at once.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            capacity,
            reserved: AtomicUsize::new(0),
            #[cfg(target_os = "linux")]
            pages: None,
        }
    }

    /// Offers expandable segments: address-space reservations into which pages of shared
    /// memory are mapped, unmapped and moved, [`DEFAULT_HOST_PAGE`] bytes each (Linux only;
    /// elsewhere this changes nothing and [`page_size`](MemoryBackend::page_size) stays `None`).
    pub fn with_page_mapping(self) -> Self {
        Self {
            #[cfg(target_os = "linux")]
            pages: Some(super::host_pages::HostPages::new(DEFAULT_HOST_PAGE)),
            ..self
        }
    }

    /// Like [`with_page_mapping`](Self::with_page_mapping) with pages of `page` bytes: a power
    /// of two, a multiple of the system page (4 KiB on x86-64) and at most 1 GiB. Smaller pages
    /// follow live memory more closely (the allocator keeps whole pages); each page can become
    /// a kernel mapping of its own, and the kernel limits those (`vm.max_map_count`).
    pub fn with_page_mapping_of(self, page: usize) -> crate::Result<Self> {
        let system = system_page();
        if !page.is_power_of_two() || !page.is_multiple_of(system) || page > MAX_HOST_PAGE {
            return Err(crate::Error::InvalidConfig(format!(
                "host page of {page} bytes: use a power of two from the system page ({system} \
                 bytes) to 1 GiB, e.g. 65536 (64 KiB) or 2097152 (2 MiB)"
            )));
        }
        Ok(Self {
            #[cfg(target_os = "linux")]
            pages: Some(super::host_pages::HostPages::new(page)),
            ..self
        })
    }

    /// Counts `bytes` more as held, or the out-of-memory error when that passes the capacity.
    fn claim(&self, bytes: usize) -> Result<(), BackendError> {
        let claimed = self.reserved.fetch_add(bytes, Ordering::Relaxed);
        if bytes == 0
            || claimed
                .checked_add(bytes)
                .is_none_or(|total| total > self.capacity)
        {
            self.reserved.fetch_sub(bytes, Ordering::Relaxed);
            return Err(BackendError::OutOfMemory {
                requested: bytes,
                free: self.free_bytes(),
            });
        }
        Ok(())
    }

    #[cfg(target_os = "linux")]
    fn host_pages(&self) -> Result<&super::host_pages::HostPages, BackendError> {
        self.pages
            .as_ref()
            .ok_or_else(|| BackendError::Unsupported {
                backend: self.name().to_string(),
                what: "page mapping (use HostBackend::with_page_mapping)",
            })
    }
}

impl Default for HostBackend {
    fn default() -> Self {
        Self::new()
    }
}

/// The system's page size (`sysconf(_SC_PAGESIZE)`; 4 KiB where it cannot be read).
fn system_page() -> usize {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sysconf only reads a system constant.
        let got = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if let Ok(page) = usize::try_from(got) {
            if page.is_power_of_two() {
                return page;
            }
        }
    }
    4096
}

fn physical_memory() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

impl MemoryBackend for HostBackend {
    fn name(&self) -> &str {
        "host"
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn free_bytes(&self) -> usize {
        self.capacity
            .saturating_sub(self.reserved.load(Ordering::Relaxed))
    }

    fn reserve(&self, bytes: usize) -> Result<u64, BackendError> {
        let oom = || BackendError::OutOfMemory {
            requested: bytes,
            free: self.free_bytes(),
        };
        self.claim(bytes)?;
        let Some(layout) = segment_layout(bytes) else {
            self.reserved.fetch_sub(bytes, Ordering::Relaxed);
            return Err(oom());
        };
        // Zeroed, so every byte a block hands out is initialised (kiln-device's unfilled kernel
        // outputs rely on it); the cost is one pass when the segment is made, not per use. The
        // zeroing comes after the huge-page advice: the kernel picks a page's size when it is
        // first touched, and `alloc_zeroed` with a 2 MiB alignment zeroes by writing (there is
        // no aligned `calloc`), which would fault every page in at 4 KiB before the advice.
        // SAFETY: `layout` has a non-zero size (checked above).
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            self.reserved.fetch_sub(bytes, Ordering::Relaxed);
            return Err(oom());
        }
        advise_huge_pages(ptr, bytes);
        // SAFETY: `ptr` is a fresh allocation of `bytes` bytes.
        unsafe { std::ptr::write_bytes(ptr, 0, bytes) };
        Ok(ptr as usize as u64)
    }

    unsafe fn release(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        let layout = segment_layout(bytes)
            .ok_or_else(|| BackendError::Driver(format!("bad host segment size {bytes}")))?;
        // SAFETY: the caller guarantees `addr`/`bytes` is a live segment from `reserve`, which
        // allocated it with this same layout.
        unsafe { std::alloc::dealloc(addr as usize as *mut u8, layout) };
        self.reserved.fetch_sub(bytes, Ordering::Relaxed);
        Ok(())
    }

    #[cfg(target_os = "linux")]
    fn page_size(&self) -> Option<usize> {
        self.pages.as_ref().map(|p| p.page())
    }

    #[cfg(target_os = "linux")]
    fn reserve_address_space(&self, bytes: usize) -> Result<u64, BackendError> {
        self.host_pages()?.reserve_address_space(bytes)
    }

    #[cfg(target_os = "linux")]
    unsafe fn release_address_space(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        self.host_pages()?.release_address_space(addr, bytes)
    }

    #[cfg(target_os = "linux")]
    fn map(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        let pages = self.host_pages()?;
        self.claim(bytes)?;
        pages.map(addr, bytes).inspect_err(|_| {
            self.reserved.fetch_sub(bytes, Ordering::Relaxed);
        })
    }

    #[cfg(target_os = "linux")]
    unsafe fn unmap(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        self.host_pages()?.unmap(addr, bytes)?;
        self.reserved.fetch_sub(bytes, Ordering::Relaxed);
        Ok(())
    }

    #[cfg(target_os = "linux")]
    unsafe fn remap(&self, from: u64, to: u64, bytes: usize) -> Result<(), BackendError> {
        self.host_pages()?.remap(from, to, bytes)
    }

    #[cfg(target_os = "linux")]
    fn supports_aliases(&self) -> bool {
        self.pages.is_some()
    }

    #[cfg(target_os = "linux")]
    fn map_alias(&self, from: u64, to: u64, bytes: usize) -> Result<(), BackendError> {
        self.host_pages()?.map_alias(from, to, bytes)
    }

    #[cfg(target_os = "linux")]
    unsafe fn unmap_alias(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        self.host_pages()?.unmap_alias(addr, bytes)
    }

    fn record_event(&self, _stream: StreamId) -> Result<EventId, BackendError> {
        Ok(EventId(0))
    }

    fn query_event(&self, _event: EventId) -> Result<bool, BackendError> {
        Ok(true)
    }

    fn synchronize_event(&self, _event: EventId) -> Result<(), BackendError> {
        Ok(())
    }

    fn destroy_event(&self, _event: EventId) {}
}
