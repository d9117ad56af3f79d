//! Page stitching on a CUDA device. `CudaBackend`'s alias mappings (a second `cuMemMap` of a
//! page's own physical handle, `cuMemUnmap` of the alias only) with the contract's refusals;
//! stitched blocks kept in the allocator's cache over them; and, where a backend offers no
//! aliases, pages moved instead (`remap`). A wrapper around `CudaBackend` counts every memory
//! call, so the calls are asserted exactly; bytes are written through one address and read
//! through the other.
//!
//! One test in this binary, so nothing else allocates on the device while it counts bytes.
//! Without a usable device it prints why and passes (fails with `KILN_REQUIRE_CUDA=1`).
#![cfg(feature = "cuda")]

use std::sync::{Arc, Mutex};

use kiln_alloc_cache::{
    AllocatorConfig, BackendError, CachingAllocator, EventId, MemoryBackend, StreamId,
};
use kiln_device::cuda::cudarc::driver::result;
use kiln_device::cuda::CudaBackend;
use kiln_device::Device;

const S0: StreamId = StreamId::DEFAULT;

/// Memory calls a [`Counted`] backend passed on.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Calls {
    reserve_space: u32,
    release_space: u32,
    map: u32,
    unmap: u32,
    remap: u32,
    map_alias: u32,
    unmap_alias: u32,
}

/// `CudaBackend` with its memory calls counted; `aliases: false` hides its alias mappings
/// (a backend without multi-mapping), so page stitching moves pages.
#[derive(Debug)]
struct Counted {
    inner: CudaBackend,
    aliases: bool,
    calls: Mutex<Calls>,
}

impl Counted {
    fn new(dev: Device, aliases: bool) -> Arc<Self> {
        let inner = CudaBackend::new(dev).unwrap();
        let calls = Mutex::default();
        Arc::new(Self {
            inner,
            aliases,
            calls,
        })
    }

    fn calls(&self) -> Calls {
        *self.calls.lock().unwrap()
    }

    fn count(&self, f: impl FnOnce(&mut Calls)) {
        f(&mut self.calls.lock().unwrap());
    }
}

impl MemoryBackend for Counted {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }
    fn free_bytes(&self) -> usize {
        self.inner.free_bytes()
    }
    fn reserve(&self, bytes: usize) -> Result<u64, BackendError> {
        self.inner.reserve(bytes)
    }
    unsafe fn release(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        // SAFETY: the caller's guarantees, passed on.
        unsafe { self.inner.release(addr, bytes) }
    }
    fn page_size(&self) -> Option<usize> {
        self.inner.page_size()
    }
    fn reserve_address_space(&self, bytes: usize) -> Result<u64, BackendError> {
        self.count(|c| c.reserve_space += 1);
        self.inner.reserve_address_space(bytes)
    }
    unsafe fn release_address_space(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        self.count(|c| c.release_space += 1);
        // SAFETY: as above.
        unsafe { self.inner.release_address_space(addr, bytes) }
    }
    fn map(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        self.count(|c| c.map += 1);
        self.inner.map(addr, bytes)
    }
    unsafe fn unmap(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        self.count(|c| c.unmap += 1);
        // SAFETY: as above.
        unsafe { self.inner.unmap(addr, bytes) }
    }
    unsafe fn remap(&self, from: u64, to: u64, bytes: usize) -> Result<(), BackendError> {
        self.count(|c| c.remap += 1);
        // SAFETY: as above.
        unsafe { self.inner.remap(from, to, bytes) }
    }
    fn supports_aliases(&self) -> bool {
        self.aliases && self.inner.supports_aliases()
    }
    fn map_alias(&self, from: u64, to: u64, bytes: usize) -> Result<(), BackendError> {
        assert!(self.aliases, "map_alias on a backend offering no aliases");
        self.count(|c| c.map_alias += 1);
        self.inner.map_alias(from, to, bytes)
    }
    unsafe fn unmap_alias(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        self.count(|c| c.unmap_alias += 1);
        // SAFETY: as above.
        unsafe { self.inner.unmap_alias(addr, bytes) }
    }
    fn record_event(&self, stream: StreamId) -> Result<EventId, BackendError> {
        self.inner.record_event(stream)
    }
    fn query_event(&self, event: EventId) -> Result<bool, BackendError> {
        self.inner.query_event(event)
    }
    fn synchronize_event(&self, event: EventId) -> Result<(), BackendError> {
        self.inner.synchronize_event(event)
    }
    fn destroy_event(&self, event: EventId) {
        self.inner.destroy_event(event)
    }
}

fn bind(dev: Device) {
    kiln_device::cuda::context(dev)
        .unwrap()
        .bind_to_thread()
        .unwrap();
}

fn write(addr: u64, bytes: &[u8]) {
    // SAFETY: every caller passes a mapped, accessible range of at least `bytes.len()` bytes.
    unsafe { result::memcpy_htod_sync(addr, bytes).unwrap() };
}

fn read(addr: u64, len: usize) -> Vec<u8> {
    let mut back = vec![0u8; len];
    // SAFETY: as for `write`.
    unsafe { result::memcpy_dtoh_sync(&mut back, addr).unwrap() };
    back
}

fn pattern(len: usize, salt: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i / 4096 + i + salt) % 251) as u8)
        .collect()
}

/// The backend alone: an alias reaches the same bytes as the pages it maps, both ways; every
/// call the contract forbids is refused before the driver and changes nothing.
fn backend_aliases(dev: Device, backend: &CudaBackend) {
    assert!(backend.supports_aliases());
    let page = backend.page_size().unwrap();
    let p = page as u64;
    let r = backend.reserve_address_space(4 * page).unwrap();
    let q = backend.reserve_address_space(4 * page).unwrap();
    backend.map(r, 3 * page).unwrap();
    bind(dev);
    let first = pattern(3 * page, 1);
    write(r, &first);
    backend.map_alias(r + p, q, 2 * page).unwrap();
    assert_eq!(backend.mapped_pages(), (3, 2));
    assert_eq!(read(q, 2 * page), first[page..]);
    let second = pattern(2 * page, 2);
    write(q, &second);
    assert_eq!(read(r + p, 2 * page), second);
    assert_eq!(
        read(r, page),
        first[..page],
        "the unaliased page is untouched"
    );

    let refused = |what: &str, got: Result<(), BackendError>, says: &str| {
        let text = got.expect_err(what).to_string();
        assert!(text.contains(says), "{what}: {text}");
        assert_eq!(
            backend.mapped_pages(),
            (3, 2),
            "{what} changed the mappings"
        );
    };
    let unmapped = r + 3 * p;
    refused(
        "alias of an unmapped page",
        backend.map_alias(unmapped, q + 2 * p, page),
        "not mapped",
    );
    refused(
        "alias of an alias",
        backend.map_alias(q, q + 2 * p, page),
        "an alias",
    );
    refused(
        "alias onto an alias",
        backend.map_alias(r, q + p, page),
        "already mapped",
    );
    refused(
        "alias onto a mapped page",
        backend.map_alias(r, r + p, page),
        "already mapped",
    );
    refused(
        "alias of part of a page",
        backend.map_alias(r + 512, q + 2 * p, page),
        "whole",
    );
    refused(
        "mapping over an alias",
        backend.map(q, page),
        "already mapped",
    );
    // SAFETY (all three): refused before any driver call, so nothing is unmapped or moved.
    refused(
        "unmapping a page with an alias",
        unsafe { backend.unmap(r, 3 * page) },
        "alias",
    );
    refused(
        "moving a page with an alias",
        unsafe { backend.remap(r + 2 * p, unmapped, page) },
        "alias",
    );
    refused(
        "unmapping memory as an alias",
        unsafe { backend.unmap_alias(r, page) },
        "not an alias",
    );
    assert_eq!(read(q, 2 * page), second, "the refusals kept the bytes");

    // SAFETY: nothing uses the alias; the pages stay mapped at `r`.
    unsafe { backend.unmap_alias(q, 2 * page).unwrap() };
    assert_eq!(backend.mapped_pages(), (3, 0));
    assert_eq!(read(r + p, 2 * page), second);
    // SAFETY: nothing uses the pages or the reservations any more.
    unsafe {
        backend.unmap(r, 3 * page).unwrap();
        backend.release_address_space(r, 4 * page).unwrap();
        backend.release_address_space(q, 4 * page).unwrap();
    }
    assert_eq!(backend.mapped_pages(), (0, 0));
}

fn stitching() -> AllocatorConfig {
    AllocatorConfig {
        page_stitching: true,
        ..AllocatorConfig::expandable()
    }
}

/// Four blocks of two pages each; the first and third are freed (two gaps of two pages
/// between live blocks), the others are filled with patterns. Returns the gaps' addresses,
/// the kept blocks and their patterns.
fn two_gaps(
    dev: Device,
    alloc: &Arc<CachingAllocator>,
    page: usize,
) -> ([u64; 2], Vec<kiln_alloc_cache::Allocation>, Vec<Vec<u8>>) {
    let mut blocks: Vec<_> = (0..4)
        .map(|_| alloc.allocate(2 * page, S0).unwrap())
        .collect();
    let kept = vec![blocks.remove(3), blocks.remove(1)];
    let gaps = [blocks[0].addr(), blocks[1].addr()];
    assert_eq!(gaps[1], gaps[0] + 4 * page as u64);
    drop(blocks);
    bind(dev);
    let patterns: Vec<_> = (0..2).map(|k| pattern(2 * page, 7 * k + 3)).collect();
    for (b, p) in kept.iter().zip(&patterns) {
        write(b.addr(), p);
    }
    (gaps, kept, patterns)
}

/// A request that fits neither gap gets a stitched block over both (two aliases, one alias
/// space, no memory); bytes written through it are the gaps' bytes; freed, it stays cached
/// and the same request takes it back with no backend call at all.
fn stitched_blocks(dev: Device) {
    let backend = Counted::new(dev, true);
    let alloc = Arc::new(CachingAllocator::new(Arc::clone(&backend), stitching()).unwrap());
    let page = alloc.backend().page_size().unwrap();
    let (gaps, kept, patterns) = two_gaps(dev, &alloc, page);
    let reserved = (8 * page) as i64;
    let before = backend.calls();
    let big = alloc.allocate(4 * page, S0).unwrap();
    let mut expect = before;
    expect.map_alias += 2;
    expect.reserve_space += 1;
    assert_eq!(backend.calls(), expect);
    assert_eq!(backend.inner.mapped_pages(), (8, 4));
    assert_eq!(alloc.memory_stats().reserved_bytes.all.current, reserved);
    let through_big = pattern(4 * page, 11);
    write(big.addr(), &through_big);
    assert_eq!(read(gaps[0], 2 * page), through_big[..2 * page]);
    assert_eq!(read(gaps[1], 2 * page), through_big[2 * page..]);
    for (b, p) in kept.iter().zip(&patterns) {
        assert!(read(b.addr(), p.len()) == *p, "a live block changed");
    }
    alloc.check_invariants().unwrap();
    let addr = big.addr();
    drop(big);
    let calls = backend.calls();
    let again = alloc.allocate(4 * page, S0).unwrap();
    assert_eq!(
        backend.calls(),
        calls,
        "a cached stitched block costs no call"
    );
    assert_eq!(again.addr(), addr);
    assert_eq!(read(again.addr(), 4 * page), through_big, "the same memory");
    alloc.check_invariants().unwrap();
    drop((kept, again));
    // Aliases go first (two runs), then the alias space and the segment's pages and space.
    assert_eq!(alloc.empty_cache().unwrap(), 8 * page);
    let end = backend.calls();
    assert_eq!(end.unmap_alias - calls.unmap_alias, 2);
    assert_eq!(end.release_space - calls.release_space, 2);
    assert_eq!(backend.inner.mapped_pages(), (0, 0));
    assert_eq!(alloc.memory_stats().reserved_bytes.all.current, 0);
}

/// Without aliases the gaps' pages move (`cuMemUnmap` + `cuMemMap` of the same handles) to a
/// request at a new peak: 6 pages get the gaps' 4 and 2 new ones, the live blocks keep their
/// bytes.
fn moved_pages(dev: Device) {
    let backend = Counted::new(dev, false);
    let alloc = Arc::new(CachingAllocator::new(Arc::clone(&backend), stitching()).unwrap());
    let page = alloc.backend().page_size().unwrap();
    let (_, kept, patterns) = two_gaps(dev, &alloc, page);
    let before = backend.calls();
    let big = alloc.allocate(6 * page, S0).unwrap();
    let mut expect = before;
    expect.remap += 2;
    expect.map += 1;
    assert_eq!(backend.calls(), expect);
    let s = alloc.memory_stats();
    assert_eq!(s.reserved_bytes.all.current, (10 * page) as i64);
    assert_eq!(s.num_device_alloc, 4 + 2 + 1);
    assert_eq!(backend.inner.mapped_pages(), (10, 0));
    let bytes = pattern(6 * page, 5);
    write(big.addr(), &bytes);
    assert_eq!(read(big.addr(), 6 * page), bytes);
    for (b, p) in kept.iter().zip(&patterns) {
        assert!(read(b.addr(), p.len()) == *p, "a live block changed");
    }
    alloc.check_invariants().unwrap();
    drop((kept, big));
    assert_eq!(alloc.empty_cache().unwrap(), 10 * page);
    assert_eq!(alloc.memory_stats().reserved_bytes.all.current, 0);
    assert_eq!(backend.calls().map_alias, 0);
}

#[test]
fn cuda_page_stitching_on_a_device() {
    let Some(dev) = kiln_device::testing::cuda_device_or_skip() else {
        return;
    };
    let backend = CudaBackend::new(dev).unwrap();
    if !backend.supports_expandable_segments() {
        assert!(!backend.supports_aliases());
        eprintln!("cuda:0 has no virtual memory management; page stitching skipped");
        return;
    }
    backend_aliases(dev, &backend);
    stitched_blocks(dev);
    moved_pages(dev);
}
