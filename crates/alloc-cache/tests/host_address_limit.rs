//! Under a process address-space limit (`ulimit -v`) below what an expandable segment reserves
//! (the capacity with headroom), an allocation fails with a report that names the address
//! space, the limit and both fixes, not a shortage of memory; fixed segments under the same
//! limit allocate. A test binary of its own: it lowers the process's limit, which a later test
//! in the same process would inherit.
#![cfg(target_os = "linux")]

use kiln_alloc_cache::*;

const MIB: usize = 1 << 20;

/// The process's mapped address space now (`VmSize`), in bytes.
fn mapped_now() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmSize:")).unwrap();
    let kib: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

#[test]
fn an_address_space_limit_below_the_reservation_names_the_limit_and_the_fixes() {
    let capacity = 64usize << 30;
    let expandable = CachingAllocator::new(
        HostBackend::with_capacity(capacity)
            .with_page_mapping_of(64 << 10)
            .unwrap(),
        AllocatorConfig {
            expandable_segments: true,
            ..AllocatorConfig::default()
        },
    )
    .unwrap();
    let fixed =
        CachingAllocator::new(HostBackend::with_capacity(capacity), Default::default()).unwrap();
    // Room for the allocations below, far less than a segment's address space (128 GiB).
    let limit = (mapped_now() + 512 * MIB) as libc::rlim_t;
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: reads and lowers this process's own soft limit; the struct outlives the calls.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_AS, &mut old), 0);
        let new = libc::rlimit {
            rlim_cur: limit.min(old.rlim_max),
            rlim_max: old.rlim_max,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_AS, &new), 0);
    }
    let report = match expandable.allocate_raw(8 * MIB, StreamId::DEFAULT) {
        Err(Error::OutOfMemory(report)) => report,
        other => panic!("expected the address space to be refused, got {other:?}"),
    };
    assert_eq!(report.address_space, 2 * capacity);
    let text = report.to_string();
    assert!(
        text.contains(
            "advice: the system refused to reserve 137438953472 bytes of address space for the \
             large pool's expandable segment"
        ),
        "{text}"
    );
    assert!(text.contains("`ulimit -v unlimited`"), "{text}");
    assert!(text.contains("turn expandable_segments off"), "{text}");
    // The fix it names: fixed segments take address space for what they hold only.
    let held = fixed.allocate_raw(8 * MIB, StreamId::DEFAULT).unwrap();
    fixed.free_raw(held).unwrap();
    // SAFETY: restores the soft limit read above (at most the unchanged hard limit).
    unsafe {
        assert_eq!(libc::setrlimit(libc::RLIMIT_AS, &old), 0);
    }
    // With the limit gone, the same allocator reserves and allocates.
    let raw = expandable.allocate_raw(8 * MIB, StreamId::DEFAULT).unwrap();
    expandable.free_raw(raw).unwrap();
}
