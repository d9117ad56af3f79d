//! The CUDA caching allocator on a real device: `CudaBackend` under the allocator in both modes,
//! the per-device registry and `CudaStorage` drawing its memory from it (page stitching is in
//! `cuda_stitching.rs`).
//!
//! One test in this binary, so nothing else allocates on the device while it counts bytes.
//! Without a usable device it prints why and passes (fails with `KILN_REQUIRE_CUDA=1`).
#![cfg(feature = "cuda")]

use std::sync::Arc;

use kiln_alloc_cache::{AllocatorConfig, CachingAllocator, Error as AllocError, StreamId};
use kiln_device::cuda::cudarc::driver::result;
use kiln_device::cuda::CudaBackend;
use kiln_device::{
    empty_cache, max_memory_allocated, memory_allocated, memory_reserved, memory_stats,
    reset_peak_memory_stats, CpuStorage, CudaStorage, Device,
};

const MIB: usize = 1 << 20;

/// Writes a pattern to `addr` and reads it back (proves the memory is mapped read-write).
fn round_trip(dev: Device, addr: u64, bytes: usize) {
    kiln_device::cuda::context(dev)
        .unwrap()
        .bind_to_thread()
        .unwrap();
    let pattern: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
    let mut back = vec![0u8; bytes];
    // SAFETY: `addr` is a live block of at least `bytes` bytes on this device.
    unsafe {
        result::memcpy_htod_sync(addr, &pattern).unwrap();
        result::memcpy_dtoh_sync(&mut back, addr).unwrap();
    }
    assert_eq!(back, pattern);
}

fn fixed_segments(dev: Device) {
    let alloc = Arc::new(
        CachingAllocator::new(CudaBackend::new(dev).unwrap(), Default::default()).unwrap(),
    );
    assert_eq!(alloc.backend().name(), "cuda:0");
    let a = alloc.allocate(3 * MIB + 5, StreamId::DEFAULT).unwrap();
    assert_eq!(a.block_size(), 3 * MIB + 512);
    round_trip(dev, a.addr(), a.size());
    let s = alloc.memory_stats();
    assert_eq!(s.allocated_bytes.all.current, (3 * MIB + 512) as i64);
    // One large segment of five whole copies of the request: 16 MiB wastes the smallest
    // fraction on its tail (alloc-cache's `mid_segment_size`; 20 MiB would hold six with 2 MiB
    // unusable).
    assert_eq!(s.reserved_bytes.all.current, (16 * MIB) as i64);
    assert_eq!(s.num_device_alloc, 1);
    let addr = a.addr();
    drop(a);
    // a hit: same block back, no driver call
    let b = alloc.allocate(3 * MIB, StreamId::DEFAULT).unwrap();
    assert_eq!(b.addr(), addr);
    assert_eq!(alloc.memory_stats().num_device_alloc, 1);
    drop(b);
    assert_eq!(alloc.empty_cache().unwrap(), 16 * MIB);
    let s = alloc.memory_stats();
    assert_eq!((s.reserved_bytes.all.current, s.num_device_free), (0, 1));
}

fn expandable_segments(dev: Device) {
    let backend = CudaBackend::new(dev).unwrap();
    if !backend.supports_expandable_segments() {
        eprintln!("cuda:0 has no virtual memory management; expandable part skipped");
        return;
    }
    let alloc = Arc::new(CachingAllocator::new(backend, AllocatorConfig::expandable()).unwrap());
    let page = alloc.backend().page_size().unwrap();
    let a = alloc.allocate(5 * MIB, StreamId::DEFAULT).unwrap();
    round_trip(dev, a.addr(), a.size());
    let reserved = (5 * MIB).div_ceil(page) * page;
    assert_eq!(
        alloc.memory_stats().reserved_bytes.all.current,
        reserved as i64
    );
    drop(a);
    // unmap every page, then map them again on the next allocation
    assert_eq!(alloc.empty_cache().unwrap(), reserved);
    assert_eq!(alloc.memory_stats().reserved_bytes.all.current, 0);
    let b = alloc.allocate(5 * MIB, StreamId::DEFAULT).unwrap();
    round_trip(dev, b.addr(), b.size());
    drop(b);
    alloc.empty_cache().unwrap();
    alloc.check_invariants().unwrap();
}

fn oom_report(dev: Device) {
    for config in [AllocatorConfig::default(), AllocatorConfig::expandable()] {
        let backend = CudaBackend::new(dev).unwrap();
        if config.expandable_segments && !backend.supports_expandable_segments() {
            continue;
        }
        let too_big = 2 * kiln_alloc_cache::MemoryBackend::capacity(&backend);
        let alloc = Arc::new(CachingAllocator::new(backend, config).unwrap());
        match alloc.allocate(too_big, StreamId::DEFAULT) {
            Err(AllocError::OutOfMemory(report)) => {
                assert_eq!(report.requested, too_big);
                assert_eq!(report.backend, "cuda:0");
                let text = report.to_string();
                assert!(
                    text.starts_with("out of memory: tried to allocate"),
                    "{text}"
                );
                assert!(text.contains("advice:"), "{text}");
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        assert_eq!(alloc.memory_stats().num_ooms, 1);
        // still usable afterwards
        drop(alloc.allocate(MIB, StreamId::DEFAULT).unwrap());
    }
}

fn registry_and_storage(dev: Device) {
    let alloc = kiln_device::allocator(dev).unwrap();
    assert!(std::ptr::eq(alloc, kiln_device::allocator(dev).unwrap()));
    if std::env::var("KILN_ALLOC_CONF").is_err() {
        assert_eq!(
            alloc.config().expandable_segments,
            alloc.backend().page_size().is_some(),
            "expandable segments are the CUDA default where VMM is supported"
        );
    }
    let before = memory_allocated(dev).unwrap();
    reset_peak_memory_stats(dev).unwrap();
    let host = CpuStorage::from_vec((0..1000).map(|i| i as f32).collect::<Vec<_>>());
    let a = CudaStorage::from_host(0, &host).unwrap();
    assert_eq!(a.block_size(), 4096); // 4000 bytes rounded to 512
    assert_eq!(memory_allocated(dev).unwrap(), before + 4096);
    let b = a.try_clone().unwrap();
    assert_ne!(a.device_ptr(), b.device_ptr());
    assert_eq!(memory_allocated(dev).unwrap(), before + 8192);
    assert_eq!(b.to_host().unwrap(), host);
    drop((a, b));
    assert_eq!(memory_allocated(dev).unwrap(), before);
    assert_eq!(max_memory_allocated(dev).unwrap(), before + 8192);
    assert!(memory_reserved(dev).unwrap() >= 2 * MIB);
    assert!(memory_stats(dev).unwrap()["num_device_alloc"] >= 1);
    if before == 0 {
        assert!(empty_cache(dev).unwrap() > 0);
        assert_eq!(memory_reserved(dev).unwrap(), 0);
    }
}

/// The device's allocation history: attributed events whose per-category sums equal the
/// allocated bytes at every event.
fn history(dev: Device) {
    use kiln_device::{AllocContext, MemoryCategory, MemoryEventKind};
    kiln_device::record_memory_history(dev, true, 10_000).unwrap();
    let host = CpuStorage::from_vec(vec![0.5f32; 1000]);
    let a = {
        let _data = AllocContext::category(MemoryCategory::Data);
        CudaStorage::from_host(0, &host).unwrap()
    };
    let addr = a.device_ptr();
    drop(a);
    let h = kiln_device::memory_history(dev).unwrap();
    kiln_device::record_memory_history(dev, false, 1).unwrap();
    let alloc = h
        .events
        .iter()
        .find(|e| e.kind == MemoryEventKind::Alloc && e.address == addr)
        .expect("the storage's alloc event");
    assert_eq!(alloc.size, 4096);
    assert_eq!(alloc.attribution.category, Some(MemoryCategory::Data));
    let freed = h
        .events
        .iter()
        .any(|e| e.kind == MemoryEventKind::FreeRequested && e.address == addr);
    assert!(freed);
    for (e, c) in h.events.iter().zip(h.category_bytes()) {
        assert_eq!(c.total(), e.allocated_after, "{e:?}");
    }
}

#[test]
fn cuda_caching_allocator_on_a_device() {
    let Some(dev) = kiln_device::testing::cuda_device_or_skip() else {
        return;
    };
    fixed_segments(dev);
    expandable_segments(dev);
    oom_report(dev);
    registry_and_storage(dev);
    history(dev);
}
