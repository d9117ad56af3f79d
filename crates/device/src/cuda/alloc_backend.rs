//! [`CudaBackend`]: the caching allocator's [`MemoryBackend`] on one CUDA device, over the raw
//! driver API (`cudarc::driver::{sys, result}`).
//!
//! One backend per device, created by the per-device allocator registry (`crate::memory`) and
//! kept for the life of the process. It holds the device's primary context and binds it to the
//! calling thread at the start of every method, because the allocator calls its backend from
//! whichever thread missed the cache.
//!
//! | allocator asks for            | driver calls                                              |
//! |-------------------------------|-----------------------------------------------------------|
//! | `reserve` / `release`         | `cuMemAlloc` / `cuMemFree`                                 |
//! | `capacity` / `free_bytes`     | `cuMemGetInfo` (total is read once; free on every call)    |
//! | `page_size`                   | `cuMemGetAllocationGranularity(RECOMMENDED)` for pinned device memory, or `None` without `VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED` |
//! | `reserve_address_space` / `release_address_space` | `cuMemAddressReserve` / `cuMemAddressFree` |
//! | `map`                         | per page `cuMemCreate` + `cuMemMap`, then one `cuMemSetAccess` (read-write) over the range |
//! | `unmap`                       | per page `cuMemUnmap` + `cuMemRelease`                     |
//! | `remap` (page stitching)      | per page `cuMemUnmap` at the old address + `cuMemMap` of the same handle at the new one, then one `cuMemSetAccess`: memory moves, none is created or released |
//! | `map_alias` (stitched blocks) | per page `cuMemMap` of the handle mapped at the source page, at the alias page too, then one `cuMemSetAccess` over the alias range: both addresses reach the same memory |
//! | `unmap_alias`                 | per page `cuMemUnmap` of the alias address only (the handle stays mapped at its page, unreleased) |
//! | events                        | a pool of `cuEventCreate(DISABLE_TIMING)` events; `cuEventRecord` / `cuEventQuery` / `cuEventSynchronize` |
//!
//! Each mapped page has its own physical handle (kept in a [`PageTable`] from page address to
//! handle), so the allocator can unmap any page-aligned sub-range later. The table also holds
//! the alias pages and refuses, before any driver call, what the `MemoryBackend` contract
//! forbids: an alias of a page that is not mapped (or is itself an alias), a map, move or alias
//! onto a mapped page, and unmapping or moving a page while an alias of it is mapped (the
//! driver itself would allow the last, keeping the memory while any mapping of it exists; the
//! allocator drops its aliases first). There are no per-allocation events or
//! synchronisations: the allocator asks for events only for blocks used on other streams
//! (`record_stream`). Giving memory back to the driver (`release`, `unmap`) first waits for the
//! device, since a cached block may still be in use by queued kernels (PyTorch does the same
//! before unmapping expandable pages); that only happens in `empty_cache`/`trim_to`, garbage
//! collection and the out-of-memory retry. Moving pages (`remap`) and unmapping an alias (a
//! cached stitched block dropped on a miss) wait the same way. `StreamId` is the `CUstream`
//! value (0 = the legacy default stream).
//! `CUDA_ERROR_OUT_OF_MEMORY` becomes [`BackendError::OutOfMemory`], which makes the allocator
//! release its cache and retry; every other driver error is [`BackendError::Driver`].

use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;
use cudarc::driver::CudaContext;
use kiln_alloc_cache::{BackendError, EventId, MemoryBackend, StreamId};

use super::page_table::PageTable;
use crate::error::Result;
use crate::Device;

/// Alignment the allocator expects of every segment.
const SEGMENT_ALIGN: u64 = 512;

/// Device memory of one CUDA device for a [`kiln_alloc_cache::CachingAllocator`].
pub struct CudaBackend {
    name: String,
    ctx: Arc<CudaContext>,
    total: usize,
    page: Option<usize>,
    /// Physical handle of every mapped page and alias page, by page address.
    pages: Mutex<PageTable>,
    /// Idle events (`CUevent` values), reused by `record_event`.
    events: Mutex<Vec<u64>>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("name", &self.name)
            .field("total", &self.total)
            .field("page", &self.page)
            .finish_non_exhaustive()
    }
}

fn driver(call: &'static str, err: DriverError) -> BackendError {
    let detail = err
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    BackendError::Driver(format!(
        "{call} failed with {} ({detail})",
        super::probe::code_name(&err)
    ))
}

fn is_oom(err: &DriverError) -> bool {
    err.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

/// The allocation properties of pinned memory on device `dev`.
fn pinned_device_prop(dev: sys::CUdevice) -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct for which all-zero is the documented "unset" value.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop
}

impl CudaBackend {
    /// The backend of `device` (a `Device::Cuda`), in its primary context.
    pub fn new(device: Device) -> Result<Self> {
        let ctx = super::context(device)?;
        let name = device.to_string();
        ctx.bind_to_thread()
            .map_err(|e| super::driver_error("cuCtxSetCurrent", e))?;
        let (_, total) = ctx
            .mem_get_info()
            .map_err(|e| super::driver_error("cuMemGetInfo", e))?;
        let vmm = ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            )
            .map_err(|e| super::driver_error("cuDeviceGetAttribute", e))?;
        let page = if vmm == 0 {
            None
        } else {
            let prop = pinned_device_prop(ctx.cu_device());
            let mut granularity = 0usize;
            // SAFETY: valid out-pointer and property struct.
            unsafe {
                sys::cuMemGetAllocationGranularity(
                    &mut granularity,
                    &prop,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
                )
            }
            .result()
            .map_err(|e| super::driver_error("cuMemGetAllocationGranularity", e))?;
            // The allocator needs pages that are whole 512-byte blocks.
            (granularity > 0 && granularity.is_multiple_of(SEGMENT_ALIGN as usize))
                .then_some(granularity)
        };
        Ok(Self {
            name,
            ctx,
            total,
            page,
            pages: Mutex::new(PageTable::new(page.unwrap_or(1))),
            events: Mutex::new(Vec::new()),
        })
    }

    /// Whether the device supports virtual memory management (expandable segments).
    pub fn supports_expandable_segments(&self) -> bool {
        self.page.is_some()
    }

    fn bind(&self) -> Result<(), BackendError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver("cuCtxSetCurrent", e))
    }

    /// Waits for all work queued on the device. Called before memory goes back to the driver:
    /// the allocator returns a block to its cache as soon as it is freed, while kernels queued
    /// on its stream may still use it (stream order makes reuse safe, but not release), and
    /// `cuMemUnmap`/`cuMemRelease` do not wait for them (nor is `cuMemFree`'s implicit
    /// synchronisation relied on). Only
    /// `empty_cache`/`trim_to`, garbage collection and the out-of-memory retry release memory,
    /// so allocation and free never reach this.
    fn wait_for_device(&self) -> Result<(), BackendError> {
        self.ctx
            .synchronize()
            .map_err(|e| driver("cuCtxSynchronize", e))
    }

    fn table(&self) -> MutexGuard<'_, PageTable> {
        self.pages.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The page size, or `Unsupported` for `what` on a device without VMM.
    fn vmm_page(&self, what: &'static str) -> Result<usize, BackendError> {
        self.page.ok_or_else(|| BackendError::Unsupported {
            backend: self.name.clone(),
            what,
        })
    }

    /// A call the `MemoryBackend` contract forbids, refused before any driver call.
    fn misuse(&self, call: &str, reason: String) -> BackendError {
        BackendError::Driver(format!("{}: {call} refused: {reason}", self.name))
    }

    /// `CUDA_ERROR_OUT_OF_MEMORY` as [`BackendError::OutOfMemory`] for `bytes`, else `call`'s
    /// driver error.
    fn failed(&self, call: &'static str, err: DriverError, bytes: usize) -> BackendError {
        if is_oom(&err) {
            BackendError::OutOfMemory {
                requested: bytes,
                free: self.free_bytes(),
            }
        } else {
            driver(call, err)
        }
    }

    /// The pages `map` mapped and the alias pages `map_alias` mapped, as counts (what the
    /// backend holds mapped right now; aliases hold no memory of their own).
    pub fn mapped_pages(&self) -> (usize, usize) {
        self.table().counts()
    }

    /// Unmaps and releases the pages of `[addr, addr + bytes)` that `map` mapped (others are
    /// skipped); refuses, changing nothing, a range that is not whole pages or that holds a
    /// page with an alias.
    fn unmap_pages(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        let Some(page) = self.page.filter(|_| bytes > 0) else {
            return Ok(()); // nothing was mapped
        };
        let mut table = self.table();
        let addrs = table
            .range(addr, bytes)
            .and_then(|a| table.check_unaliased(&a).map(|()| a))
            .map_err(|r| self.misuse("unmap", r))?;
        let mut first_error = None;
        for p in addrs {
            if let Some(handle) = table.remove(p) {
                // SAFETY: `p` is a page we mapped with `handle`; the caller guarantees no access.
                let unmapped = unsafe { sys::cuMemUnmap(p, page) }.result();
                // SAFETY: the handle is ours and is no longer mapped anywhere after the unmap
                // (it has no alias: checked above).
                let released = unsafe { sys::cuMemRelease(handle) }.result();
                if let Err(e) = unmapped {
                    first_error.get_or_insert(driver("cuMemUnmap", e));
                }
                if let Err(e) = released {
                    first_error.get_or_insert(driver("cuMemRelease", e));
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Grants the device read-write access to the mapped range `[addr, addr + bytes)`.
    fn set_access(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        let access = sys::CUmemAccessDesc {
            location: pinned_device_prop(self.ctx.cu_device()).location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the caller mapped the whole range; one descriptor.
        unsafe { sys::cuMemSetAccess(addr, bytes, &access, 1) }
            .result()
            .map_err(|e| driver("cuMemSetAccess", e))
    }
}

impl MemoryBackend for CudaBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn capacity(&self) -> usize {
        self.total
    }

    fn free_bytes(&self) -> usize {
        if self.bind().is_err() {
            return 0;
        }
        result::mem_get_info().map_or(0, |(free, _)| free)
    }

    fn reserve(&self, bytes: usize) -> Result<u64, BackendError> {
        self.bind()?;
        // SAFETY: a plain allocation; the memory is handed out uninitialised as raw bytes.
        match unsafe { result::malloc_sync(bytes) } {
            Ok(ptr) if ptr % SEGMENT_ALIGN == 0 => Ok(ptr),
            Ok(ptr) => {
                // SAFETY: just allocated, never handed out.
                let _ = unsafe { result::free_sync(ptr) };
                Err(BackendError::Driver(format!(
                    "cuMemAlloc returned {ptr:#x}, not {SEGMENT_ALIGN}-byte aligned"
                )))
            }
            Err(e) if is_oom(&e) => Err(BackendError::OutOfMemory {
                requested: bytes,
                free: self.free_bytes(),
            }),
            Err(e) => Err(driver("cuMemAlloc", e)),
        }
    }

    unsafe fn release(&self, addr: u64, _bytes: usize) -> Result<(), BackendError> {
        self.bind()?;
        self.wait_for_device()?;
        // SAFETY: the caller guarantees `addr` is a live segment from `reserve` with no pending
        // access.
        unsafe { result::free_sync(addr) }.map_err(|e| driver("cuMemFree", e))
    }

    fn page_size(&self) -> Option<usize> {
        self.page
    }

    fn reserve_address_space(&self, bytes: usize) -> Result<u64, BackendError> {
        let page = self.page.ok_or_else(|| BackendError::Unsupported {
            backend: self.name.clone(),
            what: "address-space reservation (no virtual memory management)",
        })?;
        self.bind()?;
        let mut addr: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; no fixed address requested.
        match unsafe { sys::cuMemAddressReserve(&mut addr, bytes, page, 0, 0) }.result() {
            Ok(()) => Ok(addr),
            Err(e) if is_oom(&e) => Err(BackendError::OutOfMemory {
                requested: bytes,
                free: self.free_bytes(),
            }),
            Err(e) => Err(driver("cuMemAddressReserve", e)),
        }
    }

    unsafe fn release_address_space(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        self.bind()?;
        // SAFETY: the caller guarantees this is exactly a reservation with nothing mapped.
        unsafe { sys::cuMemAddressFree(addr, bytes) }
            .result()
            .map_err(|e| driver("cuMemAddressFree", e))
    }

    fn map(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        let page = self.vmm_page("page mapping (no virtual memory management)")?;
        let addrs = {
            let table = self.table();
            let addrs = table
                .range(addr, bytes)
                .and_then(|a| table.check_unmapped(&a).map(|()| a));
            addrs.map_err(|r| self.misuse("map", r))?
        };
        self.bind()?;
        let prop = pinned_device_prop(self.ctx.cu_device());
        let mut mapped = 0usize;
        let mut failure = None;
        for at in addrs {
            let mut handle: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: valid out-pointer and property struct; `page` is the granularity.
            if let Err(e) = unsafe { sys::cuMemCreate(&mut handle, page, &prop, 0) }.result() {
                failure = Some(self.failed("cuMemCreate", e, bytes));
                break;
            }
            // SAFETY: `at` is a page-aligned, unmapped address inside one of our reservations.
            if let Err(e) = unsafe { sys::cuMemMap(at, page, 0, handle, 0) }.result() {
                // SAFETY: the handle was never mapped.
                let _ = unsafe { sys::cuMemRelease(handle) };
                failure = Some(driver("cuMemMap", e));
                break;
            }
            self.table().insert(at, handle);
            mapped += page;
        }
        if failure.is_none() {
            failure = self.set_access(addr, bytes).err();
        }
        match failure {
            None => Ok(()),
            Some(err) => {
                // Undo the part that was mapped; the range was unmapped on entry.
                let _ = self.unmap_pages(addr, mapped);
                Err(err)
            }
        }
    }

    unsafe fn unmap(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        {
            // Refused before waiting for the device; `unmap_pages` checks again.
            let table = self.table();
            let addrs = table
                .range(addr, bytes)
                .map_err(|r| self.misuse("unmap", r))?;
            table
                .check_unaliased(&addrs)
                .map_err(|r| self.misuse("unmap", r))?;
        }
        self.bind()?;
        self.wait_for_device()?;
        self.unmap_pages(addr, bytes)
    }

    unsafe fn remap(&self, from: u64, to: u64, bytes: usize) -> Result<(), BackendError> {
        let page = self.vmm_page("page mapping (no virtual memory management)")?;
        let mut table = self.table();
        let moves = table.range(from, bytes).and_then(|src| {
            let dst = table.range(to, bytes)?;
            let handles = table.check_move(&src, &dst)?;
            Ok(src.into_iter().zip(dst).zip(handles).collect::<Vec<_>>())
        });
        let moves = moves.map_err(|r| self.misuse("remap", r))?;
        self.bind()?;
        // Queued kernels may still use the old addresses (as before an unmap).
        self.wait_for_device()?;
        for ((src, dst), handle) in moves {
            // SAFETY: `src` is a page we mapped with `handle` (checked); the caller guarantees
            // no access.
            unsafe { sys::cuMemUnmap(src, page) }
                .result()
                .map_err(|e| driver("cuMemUnmap", e))?;
            // SAFETY: `dst` is a page-aligned, unmapped address (checked) inside one of our
            // reservations; the handle is live and now mapped nowhere.
            if let Err(e) = unsafe { sys::cuMemMap(dst, page, 0, handle, 0) }.result() {
                // Put the page back where it was (unreachable until access is set again).
                // SAFETY: as above, for the address it just left.
                let _ = unsafe { sys::cuMemMap(src, page, 0, handle, 0) };
                return Err(driver("cuMemMap", e));
            }
            table.move_page(src, dst);
        }
        drop(table);
        self.set_access(to, bytes)
    }

    fn supports_aliases(&self) -> bool {
        self.page.is_some()
    }

    fn map_alias(&self, from: u64, to: u64, bytes: usize) -> Result<(), BackendError> {
        let page = self.vmm_page("alias mappings (no virtual memory management)")?;
        let mut table = self.table();
        let plan = table.range(from, bytes).and_then(|src| {
            let dst = table.range(to, bytes)?;
            let handles = table.check_alias(&src, &dst)?;
            Ok(dst.into_iter().zip(handles).collect::<Vec<_>>())
        });
        let plan = plan.map_err(|r| self.misuse("map_alias", r))?;
        self.bind()?;
        let mut made = 0;
        let mut failure = None;
        for &(at, handle) in &plan {
            // SAFETY: `at` is a page-aligned address no page or alias of ours is mapped at
            // (checked), inside one of our reservations (the caller's contract); `handle` is
            // live: it is mapped at its own page, which cannot go while this alias exists.
            if let Err(e) = unsafe { sys::cuMemMap(at, page, 0, handle, 0) }.result() {
                failure = Some(self.failed("cuMemMap", e, bytes));
                break;
            }
            table.add_alias(at, handle);
            made += 1;
        }
        if failure.is_none() {
            failure = self.set_access(to, bytes).err();
        }
        let Some(err) = failure else {
            return Ok(());
        };
        for &(at, _) in &plan[..made] {
            // SAFETY: mapped just now and never handed out; the memory stays at its page.
            let _ = unsafe { sys::cuMemUnmap(at, page) };
            table.remove_alias(at);
        }
        Err(err)
    }

    unsafe fn unmap_alias(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        let page = self.vmm_page("alias mappings (no virtual memory management)")?;
        let mut table = self.table();
        let addrs = table
            .range(addr, bytes)
            .and_then(|a| table.check_aliases(&a).map(|()| a))
            .map_err(|r| self.misuse("unmap_alias", r))?;
        self.bind()?;
        // Kernels queued before the stitched block was freed may still use the alias.
        self.wait_for_device()?;
        let mut first_error = None;
        for at in addrs {
            // SAFETY: `at` is an alias page of ours (checked); the caller guarantees no access
            // through it. Only this mapping goes: the handle stays mapped at its own page.
            match unsafe { sys::cuMemUnmap(at, page) }.result() {
                Ok(()) => table.remove_alias(at),
                Err(e) => {
                    first_error.get_or_insert(driver("cuMemUnmap", e));
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn record_event(&self, stream: StreamId) -> Result<EventId, BackendError> {
        self.bind()?;
        let pooled = self.events.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let event = match pooled {
            Some(e) => e as usize as sys::CUevent,
            None => result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .map_err(|e| driver("cuEventCreate", e))?,
        };
        // SAFETY: a live event of this context; the stream id is a `CUstream` of this context.
        let recorded = unsafe { result::event::record(event, stream.0 as usize as sys::CUstream) };
        match recorded {
            Ok(()) => Ok(EventId(event as usize as u64)),
            Err(e) => {
                self.destroy_event(EventId(event as usize as u64));
                Err(driver("cuEventRecord", e))
            }
        }
    }

    fn query_event(&self, event: EventId) -> Result<bool, BackendError> {
        self.bind()?;
        // SAFETY: a live event from `record_event`.
        match unsafe { result::event::query(event.0 as usize as sys::CUevent) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(driver("cuEventQuery", e)),
        }
    }

    fn synchronize_event(&self, event: EventId) -> Result<(), BackendError> {
        self.bind()?;
        // SAFETY: a live event from `record_event`.
        unsafe { result::event::synchronize(event.0 as usize as sys::CUevent) }
            .map_err(|e| driver("cuEventSynchronize", e))
    }

    fn destroy_event(&self, event: EventId) {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(event.0);
    }
}
