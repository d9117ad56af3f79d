//! A seeded, bounded fuzz of the `.pth` reader: the fixtures written by `torch.save` are mutated
//! (bit flips, truncation, splices, huge length fields, and the same inside the zip archive's
//! pickle with its CRC fixed so the pickle machine sees them) and every case must return `Ok` or
//! a typed error: no panic, no allocation much larger than the input, and bounded time.

use kiln_models::pth::read_pth;
use kiln_models::PthError;
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The system allocator, recording the largest single request.
struct Largest;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Largest = Largest;

const SEEDS: &[(&str, &[u8])] = &[
    ("views.pth", include_bytes!("fixtures/views.pth")),
    (
        "views_deflated.pth",
        include_bytes!("fixtures/views_deflated.pth"),
    ),
    (
        "views_legacy.pth",
        include_bytes!("fixtures/views_legacy.pth"),
    ),
    (
        "views_zip64.pth",
        include_bytes!("fixtures/views_zip64.pth"),
    ),
    (
        "small_convnet.pth",
        include_bytes!("fixtures/small_convnet.pth"),
    ),
    (
        "small_convnet_legacy.pth",
        include_bytes!("fixtures/small_convnet_legacy.pth"),
    ),
];

const CASES_PER_SEED: usize = 1500;
/// A generous bound for one parse of a few KB (debug build, shared machine).
const MAX_CASE_TIME: Duration = Duration::from_secs(2);

/// SplitMix64: a small seeded generator, so every run fuzzes the same cases.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn u16_at(b: &[u8], at: usize) -> usize {
    usize::from(u16::from_le_bytes([b[at], b[at + 1]]))
}

fn u32_at(b: &[u8], at: usize) -> usize {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize
}

/// The byte range of the stored `data.pkl` entry of a zip fixture and the offset of its CRC field in
/// the central directory (read from the well-formed fixture).
fn pickle_span(zip: &[u8]) -> Option<(std::ops::Range<usize>, usize)> {
    let cd = zip.windows(4).position(|w| w == b"PK\x01\x02")?;
    let mut at = cd;
    while zip.get(at..at + 4)? == b"PK\x01\x02" {
        let (n, e, c) = (
            u16_at(zip, at + 28),
            u16_at(zip, at + 30),
            u16_at(zip, at + 32),
        );
        let name = &zip[at + 46..at + 46 + n];
        // Stored (method 0) only: a deflated pickle's CRC is over bytes the test cannot edit.
        if name.ends_with(b"/data.pkl") && u16_at(zip, at + 10) == 0 {
            let local = u32_at(zip, at + 42);
            let start = local + 30 + u16_at(zip, local + 26) + u16_at(zip, local + 28);
            return Some((start..start + u32_at(zip, at + 20), at + 16));
        }
        at += 46 + n + e + c;
    }
    None
}

/// One mutation of `bytes` inside `span` (the whole file, or the pickle of a zip archive).
fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>, span: std::ops::Range<usize>, other: &[u8]) {
    let len = span.len().max(1);
    let pick = |rng: &mut Rng| span.start + rng.below(len);
    match rng.below(5) {
        0 => {
            for _ in 0..1 + rng.below(8) {
                let at = pick(rng);
                if at < bytes.len() {
                    bytes[at] ^= 1 << rng.below(8);
                }
            }
        }
        1 => {
            let cut = pick(rng).min(bytes.len());
            bytes.truncate(cut);
        }
        2 => {
            // Splice a chunk of another fixture (or this one) over or into this one.
            let from = rng.below(other.len());
            let n = rng.below(64).min(other.len() - from);
            let at = pick(rng).min(bytes.len());
            let chunk = other[from..from + n].to_vec();
            if rng.below(2) == 0 {
                let end = (at + n).min(bytes.len());
                bytes.splice(at..end, chunk);
            } else {
                bytes.splice(at..at, chunk);
            }
        }
        3 => {
            // A huge, boundary or negative length / count / size.
            let values: [u64; 6] = [
                u64::MAX,
                u32::MAX as u64,
                i32::MAX as u64,
                0x8000_0000,
                1 << 40,
                bytes.len() as u64,
            ];
            let v = values[rng.below(values.len())].to_le_bytes();
            let width = [1, 2, 4, 8][rng.below(4)];
            let at = pick(rng);
            if at + width <= bytes.len() {
                bytes[at..at + width].copy_from_slice(&v[..width]);
            }
        }
        _ => {
            // Duplicate or drop a run of bytes (shifts every later offset).
            let at = pick(rng).min(bytes.len());
            let n = rng.below(16).min(bytes.len() - at);
            if rng.below(2) == 0 {
                bytes.drain(at..at + n);
            } else {
                let run = bytes[at..at + n].to_vec();
                bytes.splice(at..at, run);
            }
        }
    }
}

fn kind(e: &PthError) -> &'static str {
    match e {
        PthError::NotPth => "NotPth",
        PthError::Zip(_) => "Zip",
        PthError::Pickle(_) => "Pickle",
        PthError::UnknownOpcode { .. } => "UnknownOpcode",
        PthError::UnknownGlobal { .. } => "UnknownGlobal",
        PthError::Bounds { .. } => "Bounds",
        PthError::UnsupportedDtype { .. } => "UnsupportedDtype",
        PthError::NotStateDict(_) => "NotStateDict",
        _ => "other",
    }
}

#[test]
fn mutated_pth_files_never_panic_nor_allocate_much() {
    kiln_testkit::limit_address_space(kiln_testkit::FUZZ_ADDRESS_SPACE_BYTES);
    let mut rng = Rng(0x5eed_0021);
    let (mut ok, mut err, mut pickle_cases) = (0usize, 0usize, 0usize);
    let mut slowest = Duration::ZERO;
    let mut largest_input = 0usize;
    let mut largest_alloc = 0usize;
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    // One-time set-up the first tensors trigger (thread pools, allocator caches) is not the
    // reader's: do it before measuring.
    for (name, seed) in SEEDS {
        read_pth(seed).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let started = Instant::now();
    for (i, (name, seed)) in SEEDS.iter().enumerate() {
        let other = SEEDS[(i + 1) % SEEDS.len()].1;
        let pickle = pickle_span(seed);
        for case in 0..CASES_PER_SEED {
            let mut bytes = seed.to_vec();
            // Half the zip cases mutate only the pickle and fix its CRC, so they get past the
            // container's checks into the pickle machine.
            let in_pickle = pickle.as_ref().filter(|_| case % 2 == 0);
            match in_pickle {
                Some((span, crc_at)) => {
                    pickle_cases += 1;
                    let before = bytes.len();
                    mutate(&mut rng, &mut bytes, span.clone(), other);
                    // Only same-length mutations keep the archive's offsets valid.
                    if bytes.len() == before {
                        let crc = crc32fast::hash(&bytes[span.clone()]);
                        bytes[*crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
                    }
                }
                None => mutate(&mut rng, &mut bytes, 0..seed.len(), other),
            }
            for _ in 0..rng.below(3) {
                mutate(&mut rng, &mut bytes, 0..seed.len(), other);
            }
            largest_input = largest_input.max(bytes.len());
            LARGEST.store(0, Ordering::Relaxed);
            let t = Instant::now();
            let result = std::panic::catch_unwind(|| read_pth(&bytes).map(|t| t.len()));
            let took = t.elapsed();
            slowest = slowest.max(took);
            match result {
                Ok(Ok(_)) => ok += 1,
                Ok(Err(e)) => {
                    let message = e.to_string();
                    assert!(!message.is_empty());
                    kiln_testkit::assert_readable(&message);
                    *kinds.entry(kind(&e)).or_default() += 1;
                    err += 1
                }
                Err(_) => panic!("{name}, case {case}: read_pth panicked"),
            }
            assert!(took < MAX_CASE_TIME, "{name}, case {case}: {took:?}");
            let largest = LARGEST.load(Ordering::Relaxed);
            largest_alloc = largest_alloc.max(largest);
            // Nothing the reader allocates outgrows its input by much.
            assert!(
                largest <= 16 * bytes.len() + (64 << 10),
                "{name}, case {case}: an allocation of {largest} bytes for {} input bytes",
                bytes.len()
            );
        }
    }
    println!(
        "fuzz_pth: {} cases ({pickle_cases} inside a zip pickle with its CRC fixed): {ok} read, \
         {err} typed errors {kinds:?}, 0 panics; slowest {slowest:?}, total {:?}; largest allocation \
         {largest_alloc} bytes for inputs of at most {largest_input}",
        ok + err,
        started.elapsed()
    );
}
