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
//! | events                        | a pool of `cuEventCreate(DISABLE_TIMING)` events; `cuEventRecord` / `cuEventQuery` / `cuEventSynchronize` |
//!
//! Each mapped page has its own physical handle (kept in a map from page address to handle), so
//! the allocator can unmap any page-aligned sub-range later. There are no per-allocation events
//! or synchronisations: the allocator asks for events only for blocks used on other streams
//! (`record_stream`). Giving memory back to the driver (`release`, `unmap`) first waits for the
//! device, since a cached block may still be in use by queued kernels (PyTorch does the same
//! before unmapping expandable pages); that only happens in `empty_cache`/`trim_to`, garbage
//! collection and the out-of-memory retry. `StreamId` is the `CUstream` value (0 = the legacy default stream).
//! `CUDA_ERROR_OUT_OF_MEMORY` becomes [`BackendError::OutOfMemory`], which makes the allocator
//! release its cache and retry; every other driver error is [`BackendError::Driver`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;
use cudarc::driver::CudaContext;
use kiln_alloc_cache::{BackendError, EventId, MemoryBackend, StreamId};

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
    /// Physical handle of every mapped page, by page address.
    pages: Mutex<HashMap<u64, sys::CUmemGenericAllocationHandle>>,
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
            (granularity > 0 && granularity % SEGMENT_ALIGN as usize == 0).then_some(granularity)
        };
        Ok(Self {
            name,
            ctx,
            total,
            page,
            pages: Mutex::new(HashMap::new()),
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

    /// Unmaps and releases the pages of `[addr, addr + bytes)` that are in the page map.
    fn unmap_pages(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        let page = self.page.unwrap_or(bytes.max(1)) as u64;
        let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        let mut first_error = None;
        let mut p = addr;
        while p < addr + bytes as u64 {
            if let Some(handle) = pages.remove(&p) {
                // SAFETY: `p` is a page we mapped with `handle`; the caller guarantees no access.
                let unmapped = unsafe { sys::cuMemUnmap(p, page as usize) }.result();
                // SAFETY: the handle is ours and is no longer mapped anywhere after the unmap.
                let released = unsafe { sys::cuMemRelease(handle) }.result();
                if let Err(e) = unmapped {
                    first_error.get_or_insert(driver("cuMemUnmap", e));
                }
                if let Err(e) = released {
                    first_error.get_or_insert(driver("cuMemRelease", e));
                }
            }
            p += page;
        }
        first_error.map_or(Ok(()), Err)
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
        let page = self.page.ok_or_else(|| BackendError::Unsupported {
            backend: self.name.clone(),
            what: "page mapping (no virtual memory management)",
        })?;
        self.bind()?;
        let prop = pinned_device_prop(self.ctx.cu_device());
        let mut mapped = 0usize;
        let mut failure = None;
        while mapped < bytes {
            let at = addr + mapped as u64;
            let mut handle: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: valid out-pointer and property struct; `page` is the granularity.
            if let Err(e) = unsafe { sys::cuMemCreate(&mut handle, page, &prop, 0) }.result() {
                failure = Some(if is_oom(&e) {
                    BackendError::OutOfMemory {
                        requested: bytes,
                        free: self.free_bytes(),
                    }
                } else {
                    driver("cuMemCreate", e)
                });
                break;
            }
            // SAFETY: `at` is a page-aligned, unmapped address inside one of our reservations.
            if let Err(e) = unsafe { sys::cuMemMap(at, page, 0, handle, 0) }.result() {
                // SAFETY: the handle was never mapped.
                let _ = unsafe { sys::cuMemRelease(handle) };
                failure = Some(driver("cuMemMap", e));
                break;
            }
            self.pages
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(at, handle);
            mapped += page;
        }
        if failure.is_none() {
            let access = sys::CUmemAccessDesc {
                location: prop.location,
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            // SAFETY: the whole range is mapped (above); one descriptor.
            if let Err(e) = unsafe { sys::cuMemSetAccess(addr, bytes, &access, 1) }.result() {
                failure = Some(driver("cuMemSetAccess", e));
            }
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
        self.bind()?;
        self.wait_for_device()?;
        self.unmap_pages(addr, bytes)
    }

    unsafe fn remap(&self, from: u64, to: u64, bytes: usize) -> Result<(), BackendError> {
        let page = self.page.ok_or_else(|| BackendError::Unsupported {
            backend: self.name.clone(),
            what: "page mapping (no virtual memory management)",
        })?;
        self.bind()?;
        // Queued kernels may still use the old addresses (as before an unmap).
        self.wait_for_device()?;
        let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        let at = |base: u64, i: usize| base + (i * page) as u64;
        let n = bytes / page;
        if bytes % page != 0
            || (0..n).any(|i| !pages.contains_key(&at(from, i)) || pages.contains_key(&at(to, i)))
        {
            return Err(BackendError::Driver(format!(
                "remap {from:#x} -> {to:#x} (+{bytes}): needs mapped source pages and unmapped \
                 target pages of {page} bytes"
            )));
        }
        for i in 0..n {
            let (src, dst) = (at(from, i), at(to, i));
            let handle = pages[&src];
            // SAFETY: `src` is a page we mapped with `handle`; the caller guarantees no access.
            unsafe { sys::cuMemUnmap(src, page) }
                .result()
                .map_err(|e| driver("cuMemUnmap", e))?;
            // SAFETY: `dst` is a page-aligned, unmapped address inside one of our reservations;
            // the handle is live and now mapped nowhere.
            if let Err(e) = unsafe { sys::cuMemMap(dst, page, 0, handle, 0) }.result() {
                // Put the page back where it was (unreachable until access is set again).
                // SAFETY: as above, for the address it just left.
                let _ = unsafe { sys::cuMemMap(src, page, 0, handle, 0) };
                return Err(driver("cuMemMap", e));
            }
            pages.remove(&src);
            pages.insert(dst, handle);
        }
        let access = sys::CUmemAccessDesc {
            location: pinned_device_prop(self.ctx.cu_device()).location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the whole target range is mapped (above); one descriptor.
        unsafe { sys::cuMemSetAccess(to, bytes, &access, 1) }
            .result()
            .map_err(|e| driver("cuMemSetAccess", e))
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
