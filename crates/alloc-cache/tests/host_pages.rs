//! The host backend's page mapping (Linux): at every allowed page size, pages map, move, alias
//! and unmap the same memory; a refused call changes nothing; page sizes that cannot work are
//! refused with the fix.
#![cfg(target_os = "linux")]

use kiln_alloc_cache::*;

const KIB: usize = 1 << 10;
const CAPACITY: usize = 64 << 20;

fn write(addr: u64, bytes: usize, byte: u8) {
    // SAFETY: callers pass mapped pages of the backend under test.
    unsafe { std::ptr::write_bytes(addr as usize as *mut u8, byte, bytes) }
}

fn holds(addr: u64, bytes: usize, byte: u8) -> bool {
    // SAFETY: as above.
    let s = unsafe { std::slice::from_raw_parts(addr as usize as *const u8, bytes) };
    s.iter().all(|&b| b == byte)
}

/// A backend with pages of `page` bytes and a reservation of 16 of them.
fn reserved(page: usize) -> (HostBackend, impl Fn(usize) -> u64) {
    let b = HostBackend::with_capacity(CAPACITY)
        .with_page_mapping_of(page)
        .unwrap();
    assert_eq!(b.page_size(), Some(page));
    let base = b.reserve_address_space(16 * page).unwrap();
    assert_eq!(base % page as u64, 0, "reservation aligned to the page");
    (b, move |i: usize| base + (i * page) as u64)
}

#[test]
fn pages_map_move_alias_and_unmap_at_every_size() {
    for page in [4 * KIB, DEFAULT_HOST_PAGE, 2 << 20] {
        let (b, at) = reserved(page);
        b.map(at(0), 4 * page).unwrap();
        assert_eq!(b.free_bytes(), CAPACITY - 4 * page);
        for i in 0..4 {
            write(at(i), page, 0x10 + i as u8);
        }
        // Moving pages 1 and 2 to 8 and 9 takes their bytes along and holds no more memory.
        unsafe { b.remap(at(1), at(8), 2 * page) }.unwrap();
        assert!(holds(at(8), page, 0x11) && holds(at(9), page, 0x12));
        assert_eq!(b.free_bytes(), CAPACITY - 4 * page);
        // An alias is the same memory at a second address.
        b.map_alias(at(8), at(12), 2 * page).unwrap();
        write(at(12), page, 0x77);
        assert!(holds(at(8), page, 0x77) && holds(at(13), page, 0x12));
        // A page with an alias neither unmaps nor moves.
        assert!(unsafe { b.unmap(at(8), page) }.is_err());
        assert!(unsafe { b.remap(at(9), at(1), page) }.is_err());
        unsafe { b.unmap_alias(at(12), 2 * page) }.unwrap();
        // Unmapped memory goes back to the system: mapped again, it reads as zeros.
        unsafe { b.unmap(at(8), 2 * page) }.unwrap();
        assert_eq!(b.free_bytes(), CAPACITY - 2 * page);
        b.map(at(1), 2 * page).unwrap();
        assert!(holds(at(1), 2 * page, 0));
        assert!(holds(at(0), page, 0x10) && holds(at(3), page, 0x13));
        unsafe { b.unmap(at(0), 4 * page) }.unwrap();
        assert_eq!(b.free_bytes(), CAPACITY);
        unsafe { b.release_address_space(at(0), 16 * page) }.unwrap();
    }
}

#[test]
fn a_refused_call_changes_nothing() {
    let page = DEFAULT_HOST_PAGE;
    let (b, at) = reserved(page);
    b.map(at(0), 2 * page).unwrap();
    write(at(0), 2 * page, 0x42);
    // Mapping over a mapped page: refused, and page 2 was not mapped by it either.
    assert!(b.map(at(1), 2 * page).is_err());
    b.map(at(2), 2 * page).unwrap();
    write(at(2), 2 * page, 0x43);
    // A range that is no whole number of pages (its start, or its length) names the page.
    for (addr, bytes) in [(at(6) + 4096, page), (at(6), page + 4096)] {
        let e = b.map(addr, bytes).unwrap_err().to_string();
        assert!(e.contains(&format!("{page} byte page")), "{e}");
    }
    // Moving onto a mapped page, or unmapping a range with an unmapped page: refused whole.
    assert!(unsafe { b.remap(at(0), at(2), page) }.is_err());
    assert!(unsafe { b.unmap(at(3), 2 * page) }.is_err());
    assert!(b.map_alias(at(3), at(8), 2 * page).is_err());
    assert!(unsafe { b.unmap_alias(at(0), page) }.is_err());
    // Mapping or moving onto an alias page: refused, the alias still shows its memory.
    b.map_alias(at(0), at(10), page).unwrap();
    assert!(b.map(at(10), page).is_err());
    assert!(unsafe { b.remap(at(2), at(10), page) }.is_err());
    assert!(b.map_alias(at(2), at(10), page).is_err());
    assert!(holds(at(10), page, 0x42));
    unsafe { b.unmap_alias(at(10), page) }.unwrap();
    assert!(holds(at(0), 2 * page, 0x42) && holds(at(2), 2 * page, 0x43));
    assert_eq!(b.free_bytes(), CAPACITY - 4 * page);
    b.map(at(4), page).unwrap();
    unsafe { b.unmap(at(0), 5 * page) }.unwrap();
    assert_eq!(b.free_bytes(), CAPACITY);
}

#[test]
fn page_sizes_that_cannot_work_are_refused_with_the_fix() {
    for page in [0, 2048, 3000, 96 * KIB, 2 << 30] {
        let e = HostBackend::with_capacity(CAPACITY)
            .with_page_mapping_of(page)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("host page of {page} bytes")) && e.contains("power of two"),
            "{e}"
        );
    }
    let c = AllocatorConfig::parse("expandable_segments:True,host_page_kb:2048").unwrap();
    assert_eq!(c.host_page, Some(2 << 20));
    assert_eq!(AllocatorConfig::default().host_page, None);
    for (bad, says) in [
        ("host_page_kb:48", "must be a power of two"),
        ("host_page_kb:0", "must be a power of two"),
        ("host_page_kb:2", "must be a power of two"),
        (
            "host_page_kb:2097152",
            "must be a power of two from 4 KiB to 1 GiB",
        ),
        ("host_page_kb:big", "expected whole KiB"),
    ] {
        let e = AllocatorConfig::parse(bad).unwrap_err().to_string();
        assert!(e.contains(says) && e.contains("host_page"), "{bad}: {e}");
    }
}
