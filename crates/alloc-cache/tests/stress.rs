//! Multi-threaded stress on `HostBackend`: every thread writes its own pattern into each block
//! it gets and checks it is intact when freeing, so a block handed out twice (or overlapping
//! another) shows up as a corrupted pattern.

use kiln_alloc_cache::synth::SplitMix64;
use kiln_alloc_cache::*;
use std::sync::Arc;

const THREADS: usize = 4;
const ITERATIONS: usize = 3000;
const MAX_LIVE: usize = 24;

#[test]
fn threads_never_share_a_block() {
    let alloc =
        Arc::new(CachingAllocator::new(HostBackend::new(), AllocatorConfig::default()).unwrap());
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let alloc = Arc::clone(&alloc);
            std::thread::spawn(move || {
                let mut rng = SplitMix64(t as u64 * 7919 + 1);
                let mut live: Vec<(Allocation, u8)> = Vec::new();
                let mut pattern = Vec::new();
                let mut checked = 0usize;
                for i in 0..ITERATIONS {
                    if live.len() < MAX_LIVE && (live.is_empty() || rng.range(0, 1) == 0) {
                        let size = match rng.range(0, 19) {
                            0 => rng.range(1 << 20, 3 << 20),
                            _ => rng.range(0, 64 << 10),
                        } as usize;
                        let stream = StreamId(rng.range(0, 1));
                        let a = alloc.allocate(size, stream).unwrap();
                        let byte = (t * 61 + i) as u8 | 1;
                        // SAFETY: host memory owned by `a`, `size` bytes long.
                        unsafe { std::ptr::write_bytes(a.as_ptr(), byte, a.size()) };
                        live.push((a, byte));
                    } else {
                        let (a, byte) =
                            live.swap_remove(rng.range(0, live.len() as u64 - 1) as usize);
                        pattern.clear();
                        pattern.resize(a.size(), byte);
                        // SAFETY: host memory owned by `a`, `size` bytes long, initialised above.
                        let data = unsafe { std::slice::from_raw_parts(a.as_ptr(), a.size()) };
                        assert!(
                            data == &pattern[..],
                            "thread {t}: block at {:#x} was overwritten",
                            a.addr()
                        );
                        checked += 1;
                    }
                }
                checked
            })
        })
        .collect();
    let checked: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(
        checked > THREADS * ITERATIONS / 3,
        "only {checked} blocks checked"
    );
    alloc.check_invariants().unwrap();
    let s = alloc.memory_stats();
    assert_eq!(s.allocation.all.current, 0);
    assert_eq!(s.allocation.all.allocated, s.allocation.all.freed);
    let reserved = s.reserved_bytes.all.current as usize;
    assert_eq!(alloc.empty_cache().unwrap(), reserved);
    assert_eq!(alloc.backend().free_bytes(), alloc.backend().capacity());
}

#[test]
fn static_allocator_handles_free_on_drop_from_any_thread() {
    static ALLOC: std::sync::OnceLock<CachingAllocator> = std::sync::OnceLock::new();
    let alloc: &'static CachingAllocator = ALLOC.get_or_init(|| {
        CachingAllocator::new(HostBackend::new(), AllocatorConfig::default()).unwrap()
    });
    let handles: Vec<Allocation> = (0..8)
        .map(|i| {
            alloc
                .allocate_static(1000 * (i + 1), StreamId::DEFAULT)
                .unwrap()
        })
        .collect();
    assert!(matches!(handles[0].allocator(), AllocatorRef::Static(_)));
    assert_eq!(alloc.memory_stats().allocation.all.current, 8);
    std::thread::spawn(move || drop(handles)).join().unwrap();
    assert_eq!(alloc.memory_stats().allocation.all.current, 0);
    alloc.check_invariants().unwrap();
}
