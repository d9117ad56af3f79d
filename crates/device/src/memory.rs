//! One caching allocator per device, and the per-device memory API with PyTorch's names
//! (`torch.cuda.memory_allocated`, `memory_reserved`, `memory_stats`, `empty_cache`, ...).
//!
//! Every tensor buffer comes from [`allocator`]`(device)`: a process-wide
//! [`CachingAllocator`] created on first use and never dropped (so handles reference it without
//! reference counting, [`CachingAllocator::allocate_static`]).
//! - **CPU**: over [`HostBackend`], settings from `KILN_ALLOC_CONF`. With
//!   `expandable_segments:True` the backend maps memfd pages (64 KiB, or `host_page_kb:N`)
//!   into reserved address space ([`HostBackend::with_page_mapping_of`], Linux; elsewhere the
//!   setting is ignored on the CPU).
//! - **CUDA**: over [`CudaBackend`](crate::cuda::CudaBackend), one per logical device, settings
//!   from `KILN_ALLOC_CONF`. Expandable segments are **on by default** when the device supports
//!   virtual memory management (peak reserved over peak live on the recorded traces, against
//!   fixed segments: docs/ARCHITECTURE.md, "Allocation traces").
//!   `KILN_ALLOC_CONF=expandable_segments:False` turns them off.
//!
//! A failed creation (CUDA unavailable, a bad `KILN_ALLOC_CONF`) is not remembered: the next
//! call tries again and reports the same reason.
//!
//! The allocation history (`record_memory_history`, `memory_history`) is the allocator's (see
//! `kiln_alloc_cache`'s `history.rs` for the events and the attribution rules);
//! [`set_memory_plan`] registers a plan's prediction for the out-of-memory report.
//!
//! Byte counts are the allocator's: `memory_allocated` counts whole blocks (each request
//! rounded up to 512 bytes; empty tensors take no block), `memory_reserved` the segments held.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use kiln_alloc_cache::{
    AllocContext, AllocatorConfig, CachingAllocator, HostBackend, MemoryCategory, MemoryHistory,
    MemorySnapshot, MemoryStats, PlanPrediction,
};

use crate::error::{Error, Result};
use crate::Device;

/// Returns the allocator in `slot`, creating it with `create` when it does not exist yet.
/// Creation is serialised by `lock` (one per device kind, so creating a CUDA allocator may use
/// the CPU one); it is not done inside `OnceLock::get_or_init`, which could not report a
/// failure.
fn get_or_create(
    slot: &'static OnceLock<CachingAllocator>,
    lock: &Mutex<()>,
    create: impl FnOnce() -> Result<CachingAllocator>,
) -> Result<&'static CachingAllocator> {
    if let Some(a) = slot.get() {
        return Ok(a);
    }
    let _guard = lock.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(a) = slot.get() {
        return Ok(a);
    }
    let allocator = create()?;
    Ok(slot.get_or_init(|| allocator))
}

fn cpu_allocator() -> Result<&'static CachingAllocator> {
    static CPU: OnceLock<CachingAllocator> = OnceLock::new();
    static CREATE: Mutex<()> = Mutex::new(());
    get_or_create(&CPU, &CREATE, || {
        let mut config = AllocatorConfig::from_env()?;
        let backend = if config.expandable_segments {
            let page = config
                .host_page
                .unwrap_or(kiln_alloc_cache::DEFAULT_HOST_PAGE);
            HostBackend::new().with_page_mapping_of(page)?
        } else {
            HostBackend::new()
        };
        if kiln_alloc_cache::MemoryBackend::page_size(&backend).is_none() {
            config.expandable_segments = false;
            config.page_stitching = false;
        }
        Ok(CachingAllocator::new(backend, config)?)
    })
}

/// Whether `KILN_ALLOC_CONF` sets `expandable_segments` explicitly.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn expandable_set_in_env() -> bool {
    std::env::var("KILN_ALLOC_CONF").is_ok_and(|v| v.contains("expandable_segments"))
}

#[cfg(feature = "cuda")]
fn cuda_allocator(ordinal: usize) -> Result<&'static CachingAllocator> {
    use crate::cuda::CudaBackend;
    static CUDA: OnceLock<Box<[OnceLock<CachingAllocator>]>> = OnceLock::new();
    static CREATE: Mutex<()> = Mutex::new(());
    let status = crate::cuda_status();
    status.check()?;
    let count = status.device_count();
    let slots = CUDA.get_or_init(|| (0..count).map(|_| OnceLock::new()).collect());
    let slot = slots
        .get(ordinal)
        .ok_or(Error::NoSuchCudaDevice { ordinal, count })?;
    get_or_create(slot, &CREATE, || {
        let mut config = AllocatorConfig::from_env()?;
        let backend = CudaBackend::new(Device::Cuda(ordinal))?;
        if !expandable_set_in_env() {
            config.expandable_segments = backend.supports_expandable_segments();
        }
        Ok(CachingAllocator::new(backend, config)?)
    })
}

#[cfg(not(feature = "cuda"))]
fn cuda_allocator(ordinal: usize) -> Result<&'static CachingAllocator> {
    Err(Error::CudaUnavailable(format!(
        "cuda:{ordinal} requested but kiln-device was built without the `cuda` feature; rebuild with it"
    )))
}

/// The caching allocator every buffer on `device` comes from (created on first use).
///
/// Errors: CUDA unavailable (with the reason), an ordinal past the visible devices, or a bad
/// `KILN_ALLOC_CONF`.
pub fn allocator(device: Device) -> Result<&'static CachingAllocator> {
    match device {
        Device::Cpu => cpu_allocator(),
        Device::Cuda(ordinal) => cuda_allocator(ordinal),
    }
}

fn stats(device: Device) -> Result<MemoryStats> {
    Ok(allocator(device)?.memory_stats())
}

/// Bytes in blocks currently handed to tensors on `device` (PyTorch's `memory_allocated`).
pub fn memory_allocated(device: Device) -> Result<usize> {
    Ok(stats(device)?.allocated_bytes.all.current as usize)
}

/// Peak of [`memory_allocated`] since the start or the last [`reset_peak_memory_stats`].
pub fn max_memory_allocated(device: Device) -> Result<usize> {
    Ok(stats(device)?.allocated_bytes.all.peak as usize)
}

/// Bytes the allocator of `device` holds from the system or driver, in use or cached
/// (PyTorch's `memory_reserved`).
pub fn memory_reserved(device: Device) -> Result<usize> {
    Ok(stats(device)?.reserved_bytes.all.current as usize)
}

/// Peak of [`memory_reserved`] since the start or the last [`reset_peak_memory_stats`].
pub fn max_memory_reserved(device: Device) -> Result<usize> {
    Ok(stats(device)?.reserved_bytes.all.peak as usize)
}

/// Every allocator statistic of `device` as PyTorch's flat map (`"allocated_bytes.all.current"`,
/// `"num_alloc_retries"`, ...), as `torch.cuda.memory_stats` returns it.
pub fn memory_stats(device: Device) -> Result<BTreeMap<String, i64>> {
    Ok(stats(device)?.to_flat())
}

/// A readable table of `device`'s allocator statistics (PyTorch's `memory_summary`).
pub fn memory_summary(device: Device) -> Result<String> {
    Ok(allocator(device)?.memory_summary())
}

/// The segments and blocks of `device`'s allocator (serialisable to JSON with `to_json`).
pub fn memory_snapshot(device: Device) -> Result<MemorySnapshot> {
    Ok(allocator(device)?.snapshot())
}

/// Writes `device`'s recorded allocation history and its segments now to `path` as the pickle
/// `torch.cuda.memory._dump_snapshot` writes, which PyTorch's memory_viz opens unchanged
/// (`python -m torch.cuda._memory_viz trace_plot FILE -o x.html`, or pytorch.org/memory_viz).
/// Frames name the module path and op that allocated; see
/// [`kiln_alloc_cache::snapshot_pickle`]. Without a recorded history the file holds the
/// segments and an empty trace.
pub fn dump_snapshot(device: Device, path: impl AsRef<std::path::Path>) -> Result<()> {
    let history = allocator(device)?.memory_history();
    let index = match device {
        Device::Cpu => 0,
        Device::Cuda(i) => i,
    };
    kiln_alloc_cache::snapshot_pickle::write_snapshot_pickle(path.as_ref(), index, &history)?;
    Ok(())
}

/// Resets every peak statistic of `device` to its current value.
pub fn reset_peak_memory_stats(device: Device) -> Result<()> {
    allocator(device)?.reset_peak_stats();
    Ok(())
}

/// Marks the start of a training step on `device`'s allocator (PyTorch has no counterpart):
/// with `planned_steps:True` in `KILN_ALLOC_CONF` the allocator plans the loop's steps from
/// what it records between markers (see `kiln_alloc_cache`'s `planner`); without it this does
/// nothing. Call it once per optimizer step, before the step's first allocation.
pub fn mark_step(device: Device) -> Result<()> {
    Ok(allocator(device)?.mark_step()?)
}

/// Returns every cached, unused segment of `device` to the system or driver and says how many
/// bytes it released. Memory held by live tensors stays; on CUDA this may wait for work queued
/// on other streams that still uses cached blocks.
pub fn empty_cache(device: Device) -> Result<usize> {
    Ok(allocator(device)?.empty_cache()?)
}

/// Starts or stops recording `device`'s allocation history (PyTorch's
/// `torch.cuda.memory._record_memory_history`): every alloc, free, segment and out-of-memory
/// event with its size, address, stream, time and attribution, the newest `max_entries` kept.
/// Disabling keeps the history readable until recording starts again. Errors: the device's
/// allocator cannot be created, or `max_entries` is 0.
pub fn record_memory_history(device: Device, enabled: bool, max_entries: usize) -> Result<()> {
    Ok(allocator(device)?.record_memory_history(enabled, max_entries)?)
}

/// The allocation history recorded on `device` (empty when recording never started).
pub fn memory_history(device: Device) -> Result<MemoryHistory> {
    Ok(allocator(device)?.memory_history())
}

/// Registers (or clears, with `None`) what a memory plan predicted for `device`'s coming
/// steps; its out-of-memory report then prints the prediction next to what was live
/// (`kiln_models::MemoryPlan::prediction` makes one).
pub fn set_memory_plan(device: Device, prediction: Option<PlanPrediction>) -> Result<()> {
    allocator(device)?.set_plan_prediction(prediction);
    Ok(())
}

/// Gives the block behind `storage` the category `category` in the history (a tensor whose
/// role changed, such as a backward result kept as a parameter's `.grad`); does nothing unless
/// the history of its device is being recorded. Returns whether the change was recorded.
pub fn reattribute_storage(storage: &crate::Storage, category: MemoryCategory) -> bool {
    if !AllocContext::is_recording_anywhere() {
        return false;
    }
    let (device, addr) = match storage {
        crate::Storage::Cpu(c) => (Device::Cpu, c.block_addr()),
        #[cfg(feature = "cuda")]
        crate::Storage::Cuda(c) => (c.device(), c.block_addr()),
    };
    match (addr, allocator(device)) {
        (Some(addr), Ok(a)) => a.reattribute(addr, category),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_allocator_is_one_per_process() {
        let a = allocator(Device::Cpu).unwrap();
        let b = allocator(Device::Cpu).unwrap();
        assert!(std::ptr::eq(a, b));
        assert_eq!(a.backend().name(), "host");
        // Expandable (memfd pages) exactly when KILN_ALLOC_CONF asks, on Linux.
        let asked = AllocatorConfig::from_env().unwrap().expandable_segments;
        assert_eq!(
            a.config().expandable_segments,
            asked && cfg!(target_os = "linux")
        );
    }

    #[test]
    fn cpu_history_records_attributed_allocations() {
        let cpu = Device::Cpu;
        record_memory_history(cpu, true, 100_000).unwrap();
        let storage = {
            let _c = AllocContext::category(MemoryCategory::Data);
            crate::Storage::from_vec(vec![1.0f32; 1000])
        };
        let addr = match &storage {
            crate::Storage::Cpu(c) => c.block_addr().unwrap(),
            #[cfg(feature = "cuda")]
            _ => unreachable!("a host storage"),
        };
        assert!(reattribute_storage(&storage, MemoryCategory::Parameter));
        let h = memory_history(cpu).unwrap();
        use kiln_alloc_cache::MemoryEventKind::*;
        let block_event = |k| !matches!(k, SegmentAlloc | SegmentFree);
        let mine: Vec<_> = h
            .events
            .iter()
            .filter(|e| e.address == addr && block_event(e.kind))
            .collect();
        // Other tests of this binary allocate on the CPU too: look at this block's events.
        let kinds: Vec<_> = mine.iter().map(|e| e.kind).collect();
        assert_eq!(kinds[..4], [Alloc, FreeRequested, FreeCompleted, Alloc]);
        assert_eq!(mine[0].attribution.category, Some(MemoryCategory::Data));
        assert_eq!(mine[0].size, 4096, "1000 f32 in a 512-byte multiple");
        assert_eq!(
            mine[3].attribution.category,
            Some(MemoryCategory::Parameter)
        );
        drop(storage);
        record_memory_history(cpu, false, 1).unwrap();
        assert!(!memory_history(cpu).unwrap().recording);
    }

    #[test]
    fn cuda_without_a_device_reports_why() {
        if crate::cuda_status().is_available() {
            return; // covered by the GPU tests in tests/cuda_memory.rs
        }
        let err = memory_allocated(Device::Cuda(0)).unwrap_err();
        assert!(matches!(err, Error::CudaUnavailable(_)), "{err}");
        assert!(err.to_string().starts_with("CUDA unavailable: "), "{err}");
    }
}
