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

/// Writes `byte` over all of `a`.
fn fill(a: &Allocation, byte: u8) {
    // SAFETY: host memory owned by `a`, `size` bytes long.
    unsafe { std::ptr::write_bytes(a.as_ptr(), byte, a.size()) };
}

/// Whether all of `a` still holds `byte`.
fn intact(a: &Allocation, byte: u8) -> bool {
    // SAFETY: host memory owned by `a`, `size` bytes long, written by `fill`.
    let bytes = unsafe { std::slice::from_raw_parts(a.as_ptr() as *const u8, a.size()) };
    bytes.iter().all(|&b| b == byte)
}

/// Planned steps on the host while kernel-scratch threads ([`StepThread::OUTSIDE`]) take and
/// free blocks during each step, borrowing the plan's idle bin space: every block keeps its
/// pattern, so no lent block overlaps a planned one or another lent one, and every step after
/// the first is served from the plan.
#[test]
fn scratch_lent_by_a_plan_never_overlaps_a_planned_block() {
    let config = AllocatorConfig {
        planned_steps: true,
        ..AllocatorConfig::default()
    };
    let alloc = Arc::new(CachingAllocator::new(HostBackend::new(), config).unwrap());
    const MIB: usize = 1 << 20;
    let step_sizes = [12 * MIB, 12 * MIB, 12 * MIB, 12 * MIB];
    let steps = 8;
    for step in 0..steps {
        alloc.mark_step().unwrap();
        std::thread::scope(|s| {
            // No scratch in the recorded step: from the next one, it finds no free block.
            for t in (0..3).filter(|_| step > 0) {
                let alloc = &alloc;
                s.spawn(move || {
                    let _scratch = StepThread::OUTSIDE.enter();
                    let mut rng = SplitMix64((step * 3 + t) as u64 + 11);
                    for i in 0..12 {
                        let a = alloc
                            .allocate(rng.range(2, 6) as usize * MIB, StreamId::DEFAULT)
                            .unwrap();
                        let byte = (t * 40 + i) as u8 | 0x80;
                        fill(&a, byte);
                        std::thread::yield_now();
                        assert!(intact(&a, byte), "scratch overwritten in step {step}");
                    }
                });
            }
            let mut live: Vec<(Allocation, u8)> = Vec::new();
            for (i, &bytes) in step_sizes.iter().enumerate() {
                let a = alloc.allocate(bytes, StreamId::DEFAULT).unwrap();
                fill(&a, i as u8 + 1);
                live.push((a, i as u8 + 1));
                std::thread::yield_now();
                if i % 2 == 1 {
                    let (a, byte) = live.remove(0);
                    assert!(intact(&a, byte), "planned block overwritten in step {step}");
                }
            }
            for (a, byte) in live {
                assert!(intact(&a, byte), "planned block overwritten in step {step}");
            }
        });
        alloc.check_invariants().unwrap();
    }
    alloc.mark_step().unwrap();
    let (c, _) = alloc.plan_counts();
    assert_eq!(
        (c.planned_steps, c.fallback_steps),
        (steps as u64 - 1, 0),
        "{c:?}"
    );
    assert!(c.lent_allocs > 0, "{c:?}");
}
