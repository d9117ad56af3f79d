//! The fuzz harness: a seeded generator, and `run`, which feeds generated cases to a check
//! under `catch_unwind` with a per-case time limit and reports what happened.
//!
//! Invariants: the same seed gives the same cases on every machine (splitmix64, no OS
//! randomness); a panic in a check is caught and recorded with the case that caused it, so one
//! run lists every panicking case; a case running past [`CASE_LIMIT`] is a hang: the watchdog
//! prints the case and exits the process with status 3 (a stuck thread cannot be stopped), so
//! CI counts it as a failure. An abort (an allocation the system refuses under the
//! address-space limit [`run`] sets) ends the process by itself and fails the run too.

use std::fmt::Debug;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Multiplies every target's case count, for a longer local hunt (`KILN_FUZZ_SCALE=20`); CI
/// leaves it unset (1), so its cases are fixed.
pub fn scale() -> usize {
    std::env::var("KILN_FUZZ_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// Mixed into every target's seed for a hunt on other cases (`KILN_FUZZ_SEED=7`); CI leaves
/// it unset (0), so its cases are fixed.
pub fn seed_offset() -> u64 {
    std::env::var("KILN_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Longest a single case may run (debug build, shared machine) before it counts as a hang.
pub const CASE_LIMIT: Duration = Duration::from_secs(10);

/// splitmix64: small, seedable, and the same everywhere.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    pub fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())].clone()
    }

    /// A size that is usually small and sometimes hostile (0, a power of two near the top of
    /// `usize`, `usize::MAX`).
    pub fn size(&mut self) -> usize {
        match self.below(6) {
            0 => self.below(8),
            1 => self.below(1 << 12),
            2 => 1usize << self.below(64),
            3 => usize::MAX - self.below(4),
            4 => (1usize << self.below(64))
                .wrapping_add(self.below(3))
                .wrapping_sub(1),
            _ => self.next_u64() as usize,
        }
    }
}

/// What one target's run found.
#[derive(Debug, Default)]
pub struct Report {
    /// Cases run.
    pub cases: usize,
    /// Cases the API accepted (`Ok`).
    pub accepted: usize,
    /// Cases the API refused with an error (the expected outcome for hostile input).
    pub refused: usize,
    /// Cases that panicked: `(case index, the input)`.
    pub panics: Vec<(usize, String)>,
}

/// What a check says about one case: accepted or refused. A wrong result is a panic (assert).
pub enum Outcome {
    Accepted,
    Refused,
}

impl<T, E: std::fmt::Display> From<Result<T, E>> for Outcome {
    /// A refusal's message is checked with [`assert_readable`].
    fn from(r: Result<T, E>) -> Self {
        match r {
            Ok(_) => Outcome::Accepted,
            Err(e) => refused(e),
        }
    }
}

/// A refusal, its message checked with [`assert_readable`].
pub fn refused(error: impl std::fmt::Display) -> Outcome {
    assert_readable(&error.to_string());
    Outcome::Refused
}

pub use kiln_testkit::assert_readable;

/// Runs `cases` cases of `target` from `seed`: `generate` makes an input, `check` calls the
/// public API on it. Prints one summary line and fails the test on any panic.
pub fn run<I: Debug>(
    target: &str,
    seed: u64,
    cases: usize,
    mut generate: impl FnMut(&mut Rng) -> I,
    mut check: impl FnMut(&I) -> Outcome,
) -> Report {
    kiln_testkit::limit_address_space(kiln_testkit::FUZZ_ADDRESS_SPACE_BYTES);
    let seed = seed ^ seed_offset().wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut rng = Rng::new(seed);
    let current: Arc<Mutex<Option<(usize, Instant, String)>>> = Arc::new(Mutex::new(None));
    let done = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let (current, done, target) = (current.clone(), done.clone(), target.to_string());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
                let now = current.lock().unwrap_or_else(|p| p.into_inner());
                if let Some((case, started, input)) = &*now {
                    if started.elapsed() > CASE_LIMIT {
                        eprintln!(
                            "fuzz {target}: case {case} (seed {seed:#x}) ran over {CASE_LIMIT:?}: \
                             a hang on input {input}"
                        );
                        std::process::exit(3);
                    }
                }
            }
        })
    };
    let mut report = Report::default();
    for case in 0..cases.saturating_mul(scale()) {
        let input = generate(&mut rng);
        let shown = format!("{input:?}");
        *current.lock().unwrap_or_else(|p| p.into_inner()) = Some((case, Instant::now(), shown));
        match catch_unwind(AssertUnwindSafe(|| check(&input))) {
            Ok(Outcome::Accepted) => report.accepted += 1,
            Ok(Outcome::Refused) => report.refused += 1,
            Err(_) => {
                // Printed under the panic's message, so a hunt with many panics shows each
                // message with its input (the summary below lists only the first few).
                eprintln!("fuzz {target}: the input of case {case}: {input:?}");
                report.panics.push((case, format!("{input:?}")))
            }
        }
        *current.lock().unwrap_or_else(|p| p.into_inner()) = None;
        report.cases += 1;
    }
    done.store(true, Ordering::Relaxed);
    let _ = watchdog.join();
    println!(
        "fuzz {target}: {} cases from seed {seed:#x}: {} accepted, {} refused with an error, {} \
         panics",
        report.cases,
        report.accepted,
        report.refused,
        report.panics.len()
    );
    assert!(
        report.panics.is_empty(),
        "fuzz {target}: {} of {} cases panicked; first inputs: {:#?}",
        report.panics.len(),
        report.cases,
        &report.panics[..report.panics.len().min(5)]
    );
    report
}
