//! The CPU allocator with expandable segments from `KILN_ALLOC_CONF` (Linux): the host page it
//! asks for is the one used, and a page size that cannot work fails the allocator's creation
//! with the fix instead of being rounded or ignored. A test binary of its own: the CPU
//! allocator is created once per process, from the environment at that moment.
#![cfg(target_os = "linux")]

use kiln_alloc_cache::StreamId;
use kiln_device::{allocator, memory_reserved, Device};

#[test]
fn the_host_page_comes_from_kiln_alloc_conf() {
    // A refused setting is not remembered: the next call reads the environment again.
    std::env::set_var(
        "KILN_ALLOC_CONF",
        "expandable_segments:True,host_page_kb:48",
    );
    let e = allocator(Device::Cpu).unwrap_err().to_string();
    assert!(
        e.contains("host page of 49152 bytes must be a power of two")
            && e.contains("host_page_kb:64"),
        "{e}"
    );
    std::env::set_var(
        "KILN_ALLOC_CONF",
        "expandable_segments:True,page_stitching:True,host_page_kb:128",
    );
    let a = allocator(Device::Cpu).unwrap();
    std::env::remove_var("KILN_ALLOC_CONF");
    assert_eq!(a.backend().page_size(), Some(128 << 10));
    assert!(a.config().expandable_segments && a.config().page_stitching);
    let before = memory_reserved(Device::Cpu).unwrap();
    let block = a.allocate_static(300_000, StreamId::DEFAULT).unwrap();
    let reserved = memory_reserved(Device::Cpu).unwrap();
    // 300,000 bytes take three 128 KiB pages of the large pool's segment.
    assert_eq!(reserved - before, 3 * (128 << 10));
    drop(block);
}
