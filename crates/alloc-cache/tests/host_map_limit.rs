//! When the process runs out of kernel memory mappings (`vm.max_map_count`), mapping host pages
//! fails with an error that names the limit and both fixes (larger pages, a higher limit)
//! instead of reporting the memory as exhausted, and unmapping pages makes room again, even
//! where the last page mapped took the count one past the limit (the kernel then refuses every
//! `mmap`, even one that would merge mappings). A test binary of its own: it uses up the
//! process's mappings.
#![cfg(target_os = "linux")]

use kiln_alloc_cache::*;

/// Runs the check twice: as the process stands, and with one more mapping of its own, so that
/// both counts of mappings left when the limit is hit (a mapped page between two gaps takes
/// two) are tested whatever the binary itself maps.
#[test]
fn running_out_of_mappings_names_the_limit_and_the_fixes() {
    out_of_mappings_and_back();
    let extra = 4096;
    // SAFETY: a fresh private mapping of our own, unmapped below.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            extra,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(at, libc::MAP_FAILED);
    out_of_mappings_and_back();
    // SAFETY: the mapping made above, no longer used.
    assert_eq!(unsafe { libc::munmap(at, extra) }, 0);
}

fn out_of_mappings_and_back() {
    let limit: usize = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(usize::MAX);
    if limit > 300_000 {
        eprintln!("skipped: vm.max_map_count is {limit}; the test maps every other page until the limit and needs it at most 300000");
        return;
    }
    let page = 4096;
    let b = HostBackend::with_capacity(1 << 40)
        .with_page_mapping_of(page)
        .unwrap();
    // Every other page mapped: each is a mapping of its own, and so is each gap between two.
    let pages = limit + 16;
    let base = b.reserve_address_space(2 * pages * page).unwrap();
    let at = |i: usize| base + (2 * i * page) as u64;
    let mut mapped = 0;
    let e = loop {
        assert!(
            mapped < pages,
            "mapped {mapped} separate pages under a limit of {limit}"
        );
        match b.map(at(mapped), page) {
            Ok(()) => mapped += 1,
            Err(e) => break e,
        }
    };
    let text = e.to_string();
    assert!(
        text.contains("vm.max_map_count")
            && text.contains("host_page_kb:2048")
            && text.contains("sysctl"),
        "{text}"
    );
    assert!(!matches!(e, BackendError::OutOfMemory { .. }), "{e:?}");
    for i in 0..64 {
        unsafe { b.unmap(at(i), page) }.unwrap();
    }
    b.map(at(mapped), page).unwrap();
    unsafe { b.unmap(at(mapped), page) }.unwrap();
    for i in 64..mapped {
        unsafe { b.unmap(at(i), page) }.unwrap();
    }
    assert_eq!(b.free_bytes(), 1 << 40);
    unsafe { b.release_address_space(base, 2 * pages * page) }.unwrap();
}
