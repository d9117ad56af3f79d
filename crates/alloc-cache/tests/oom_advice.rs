//! The out-of-memory report's advice fits the backend and the request (issue 18): the host
//! backend, which has no expandable segments, is never told to turn them on; one request larger
//! than the whole backend is told so (the system refused N bytes), not to reduce the batch
//! size; a reservation refused although the backend counted room names the outside limit.

use kiln_alloc_cache::*;

const MIB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

fn oom_text(a: &CachingAllocator, bytes: usize) -> (OomReport, String) {
    oom_text_on(a, bytes, S0)
}

/// [`oom_text`] for a request on `stream`.
fn oom_text_on(a: &CachingAllocator, bytes: usize, stream: StreamId) -> (OomReport, String) {
    match a.allocate_raw(bytes, stream) {
        Err(Error::OutOfMemory(report)) => {
            let text = report.to_string();
            (*report, text)
        }
        Err(other) => panic!("expected an OOM report for {bytes} bytes, got {other}"),
        Ok(_) => panic!("{bytes} bytes were allocated, expected an OOM report"),
    }
}

#[test]
fn one_host_request_larger_than_the_memory_says_so_and_not_batch_size_or_expandable() {
    let a = CachingAllocator::new(
        HostBackend::with_capacity(64 * MIB),
        AllocatorConfig::default(),
    )
    .unwrap();
    // About 3.6 TiB, the single request.
    let request = 3_960_000_000_000;
    let (report, text) = oom_text(&a, request);
    assert_eq!(report.requested, request);
    assert!(!report.expandable_supported);
    for needle in [
        "tried to allocate 3.60 TiB (3960000000000 bytes)",
        "advice: this one request is larger than all the memory the host backend has \
         (capacity 64.00 MiB (67108864 bytes)): the system refused 3960000000000 bytes",
        "check the size that asked for it",
    ] {
        assert!(text.contains(needle), "`{needle}` missing from:\n{text}");
    }
    for wrong in ["expandable", "reduce the batch size"] {
        assert!(!text.contains(wrong), "`{wrong}` in:\n{text}");
    }
}

#[test]
fn host_fragmentation_advice_names_no_expandable_segments() {
    let a = CachingAllocator::new(
        HostBackend::with_capacity(24 * MIB),
        AllocatorConfig::default(),
    )
    .unwrap();
    // Two 6 MiB blocks in one 18 MiB segment (three copies), the first freed: 12 MiB free in
    // two pieces, 6 MiB left in the backend; 9 MiB (a 10 MiB segment) fits in neither.
    let x = a.allocate_raw(6 * MIB, S0).unwrap();
    let y = a.allocate_raw(6 * MIB, S0).unwrap();
    a.free_raw(x).unwrap();
    let (report, text) = oom_text(&a, 9 * MIB);
    assert_eq!(report.reserved_unallocated, 12 * MIB);
    assert_eq!(report.backend_free, 6 * MIB);
    assert!(
        text.contains(
            "advice: enough memory is free in total but not in one piece: set max_split_size_mb"
        ),
        "{text}"
    );
    assert!(
        text.contains("(the host backend has no expandable segments)"),
        "{text}"
    );
    assert!(!text.contains("turn on expandable"), "{text}");
    assert!(!text.contains("KILN_ALLOC_CONF=expandable"), "{text}");
    a.free_raw(y).unwrap();
}

/// Host memory that counts plenty free but refuses every segment over `limit` bytes, as
/// `ulimit -v` makes the system allocator do.
struct LimitedHost {
    inner: HostBackend,
    limit: usize,
}

impl MemoryBackend for LimitedHost {
    fn name(&self) -> &str {
        "host"
    }
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }
    fn free_bytes(&self) -> usize {
        self.inner.free_bytes()
    }
    fn reserve(&self, bytes: usize) -> Result<u64, BackendError> {
        if bytes > self.limit {
            return Err(BackendError::OutOfMemory {
                requested: bytes,
                free: self.free_bytes(),
            });
        }
        self.inner.reserve(bytes)
    }
    unsafe fn release(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { self.inner.release(addr, bytes) }
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

#[test]
fn a_refusal_with_room_counted_names_the_outside_limit() {
    let backend = LimitedHost {
        inner: HostBackend::with_capacity(1 << 30),
        limit: 8 * MIB,
    };
    let a = CachingAllocator::new(backend, AllocatorConfig::default()).unwrap();
    // Past 15 MiB by one byte: the smallest reservation is whole 2 MiB pages, 16 MiB.
    let (report, text) = oom_text(&a, 15 * MIB + 1);
    assert_eq!(report.min_reservation, 16 * MIB);
    assert!(
        text.contains(
            "advice: the system refused to reserve 16777216 bytes although the host backend \
             counts 1.00 GiB (1073741824 bytes) free"
        ),
        "{text}"
    );
    assert!(text.contains("`ulimit -v`"), "{text}");
    assert!(!text.contains("expandable"), "{text}");
    assert!(!text.contains("reduce the batch size"), "{text}");
}

/// A report of an 8 MiB request on an 80 MiB device with nothing free anywhere: "live tensors".
fn report() -> OomReport {
    OomReport {
        backend: "sim".into(),
        requested: 8 * MIB,
        rounded: 8 * MIB,
        stream: S0,
        pool: PoolKind::Large,
        capacity: 80 * MIB,
        backend_free: 0,
        allocated: 80 * MIB,
        reserved: 80 * MIB,
        reserved_unallocated: 0,
        largest_free_block: 0,
        fragmentation: 0.0,
        expandable_segments: false,
        expandable_supported: true,
        min_reservation: 8 * MIB,
        address_space: 0,
        top_live: Vec::new(),
        history_recorded: false,
        plan: None,
    }
}

/// Each advice at the exact boundary that selects it (the cases that tell `<` from `<=`).
#[test]
fn each_advice_is_chosen_at_its_exact_boundary() {
    let advice = |r: OomReport| {
        let text = r.to_string();
        text[text.find("advice: ").expect("an advice")..].to_string()
    };
    assert!(advice(report()).starts_with("advice: live tensors use the device"));
    // A request of exactly the capacity is not "larger than all the memory".
    let whole = OomReport {
        requested: 80 * MIB,
        rounded: 80 * MIB,
        min_reservation: 80 * MIB,
        ..report()
    };
    assert!(advice(whole).starts_with("advice: live tensors use the device"));
    let larger = OomReport {
        requested: 80 * MIB + 1,
        rounded: 80 * MIB + 512,
        min_reservation: 82 * MIB,
        ..report()
    };
    assert!(advice(larger).starts_with("advice: this one request is larger than all the memory"));
    // Exactly the smallest reservation counted free, yet refused: a limit outside kiln.
    let counted = OomReport {
        backend_free: 8 * MIB,
        ..report()
    };
    assert!(advice(counted).starts_with("advice: the system refused to reserve 8388608 bytes"));
    // The same refusal where the pool had no expandable segment yet: its address space.
    let no_segment = OomReport {
        backend_free: 8 * MIB,
        expandable_segments: true,
        address_space: 160 * MIB,
        ..report()
    };
    assert!(advice(no_segment).starts_with(
        "advice: the system refused to reserve 167772160 bytes of address space for the large \
         pool's expandable segment"
    ));
    // ... and where memory ran short, not addresses, the advice stays the memory's.
    let short = OomReport {
        backend_free: 8 * MIB - 1,
        expandable_segments: true,
        address_space: 160 * MIB,
        ..report()
    };
    assert!(!advice(short).contains("address space"));
    // Free memory adding up to exactly the request, in pieces: fragmentation.
    let pieces = OomReport {
        backend_free: 2 * MIB,
        reserved_unallocated: 6 * MIB,
        allocated: 74 * MIB,
        ..report()
    };
    assert!(advice(pieces).starts_with(
        "advice: enough memory is free in total but not in one piece: turn on expandable"
    ));
}

/// The report names the stream that asked.
#[test]
fn the_report_names_the_requesting_stream() {
    let a = CachingAllocator::new(
        HostBackend::with_capacity(8 * MIB),
        AllocatorConfig::default(),
    )
    .unwrap();
    let (report, text) = oom_text_on(&a, 16 * MIB, StreamId(3));
    assert_eq!(report.stream, StreamId(3));
    assert!(
        text.contains(&format!("on stream {}", StreamId(3))),
        "{text}"
    );
}
