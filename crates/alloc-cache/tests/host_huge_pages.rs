//! The host backend's large segments are backed by transparent huge pages from their first
//! touch (Linux, where the kernel offers them for advised memory): the advice has to come before
//! the zero-fill, since the kernel picks a page's size when the page is first written. Zeroing
//! first (as `alloc_zeroed` does for 2 MiB-aligned layouts) faults every page in at 4 KiB, and a
//! pass over such a segment can run at half the bandwidth on a VM.
#![cfg(target_os = "linux")]

use kiln_alloc_cache::*;

const SEGMENT: usize = 16 << 20;

/// `AnonHugePages` of the mapping holding `addr`, in bytes (`None` if no mapping holds it).
fn huge_bytes_at(addr: u64) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut inside = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = first.split_once('-') {
            if let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) {
                inside = (lo..hi).contains(&addr);
                continue;
            }
        }
        if inside {
            if let Some(kb) = line.strip_prefix("AnonHugePages:") {
                return kb
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .map(|k| k << 10);
            }
        }
    }
    None
}

/// The kernel's count of huge-page faults that fell back to small pages (fragmented memory).
fn fallbacks() -> u64 {
    let vmstat = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
    vmstat
        .lines()
        .find_map(|l| l.strip_prefix("thp_fault_fallback "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn large_segments_are_zeroed_and_backed_by_huge_pages() {
    let b = HostBackend::with_capacity(4 * SEGMENT);
    let before = fallbacks();
    let addr = b.reserve(SEGMENT).unwrap();
    assert_eq!(addr % (2 << 20), 0, "aligned to the huge page");
    // SAFETY: a live segment of SEGMENT bytes from this backend.
    let bytes = unsafe { std::slice::from_raw_parts(addr as usize as *const u8, SEGMENT) };
    assert!(
        bytes.iter().all(|&x| x == 0),
        "a new segment reads as zeros"
    );
    let mode =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let huge = huge_bytes_at(addr);
    // SAFETY: reserved above with this size, released once.
    unsafe { b.release(addr, SEGMENT).unwrap() };
    if !(mode.contains("[madvise]") || mode.contains("[always]")) {
        eprintln!(
            "skipped: transparent huge pages are off here ({})",
            mode.trim()
        );
        return;
    }
    if fallbacks() > before {
        eprintln!("skipped: the kernel fell back to small pages (fragmented memory)");
        return;
    }
    let huge = huge.expect("the segment's mapping is in /proc/self/smaps");
    assert_eq!(
        huge, SEGMENT as u64,
        "the whole segment on huge pages from its first touch ({huge} of {SEGMENT} bytes)"
    );
}
