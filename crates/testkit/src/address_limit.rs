//! The fuzz suites' own `ulimit -v`: a cap on the test process's address space, so an
//! allocation sized from hostile input that slips past a check fails the run (the allocation
//! is refused and the process aborts) instead of swapping or being killed by the kernel's
//! out-of-memory killer, however the suite is started.
//!
//! Invariants: the cap only ever lowers the soft limit (a lower limit already in force, such as
//! a shell's `ulimit -v`, is kept); it is set at most once per process; on a platform without
//! `setrlimit` it does nothing and says so once on stderr.

use std::sync::Once;

/// The cap the fuzz suites run under: about 8 GB, the figure CI has always used
/// (`ulimit -v 8000000`, in KiB). The suites' largest legitimate case needs well under it.
pub const FUZZ_ADDRESS_SPACE_BYTES: u64 = 8_000_000 * 1024;

/// Lowers this process's address-space limit (`RLIMIT_AS`) to `bytes` unless it already is at
/// or below it; later calls do nothing. Call it first in every test of a fuzz suite.
pub fn limit_address_space(bytes: u64) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| set_limit(bytes));
}

#[cfg(unix)]
fn set_limit(bytes: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the current limits into `limit`, a valid rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) } != 0 {
        eprintln!(
            "kiln-testkit: cannot read the address-space limit; the fuzz suite runs without one"
        );
        return;
    }
    // `rlim_t` is `u64` on Linux but not on every unix.
    #[allow(clippy::unnecessary_cast)]
    let wanted = (bytes as libc::rlim_t).min(limit.rlim_max);
    if limit.rlim_cur != libc::RLIM_INFINITY && limit.rlim_cur <= wanted {
        return;
    }
    limit.rlim_cur = wanted;
    // SAFETY: setrlimit reads `limit`, a valid rlimit whose soft limit is at most its hard one.
    if unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) } != 0 {
        eprintln!(
            "kiln-testkit: cannot lower the address-space limit to {bytes} bytes; the fuzz suite \
             runs without it (run it under `ulimit -v 8000000` instead)"
        );
    }
}

#[cfg(not(unix))]
fn set_limit(_bytes: u64) {
    eprintln!(
        "kiln-testkit: no address-space limit on this platform; the fuzz suite runs without one"
    );
}

#[cfg(all(test, unix))]
#[allow(clippy::unnecessary_cast)] // `rlim_t` is `u64` on Linux but not on every unix
mod tests {
    use super::*;

    fn soft_limit() -> libc::rlim_t {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: as in `set_limit`.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) }, 0);
        limit.rlim_cur
    }

    /// One test only: the limit is process-wide, and this crate's other tests allocate little.
    #[test]
    fn the_limit_is_lowered_once_and_never_raised() {
        let before = soft_limit();
        let cap = 64u64 << 30;
        limit_address_space(cap);
        let after = soft_limit();
        if before == libc::RLIM_INFINITY || before as u64 > cap {
            assert_eq!(after as u64, cap);
        } else {
            assert_eq!(after, before, "a lower limit already in force is kept");
        }
        // a second call, even with a lower figure, changes nothing
        limit_address_space(cap / 2);
        assert_eq!(soft_limit(), after);
        // an allocation past the limit is refused, not served
        let too_big = usize::try_from(after as u64).unwrap_or(usize::MAX);
        let mut v: Vec<u8> = Vec::new();
        assert!(v.try_reserve_exact(too_big).is_err());
    }
}
