//! The rendezvous of one communicator's ranks: a shared-memory file (in `/dev/shm`) named by the
//! unique id, mapped by every rank, whether the ranks are threads of one process or separate
//! processes on one machine. Invariants:
//! - The file holds a header (rank count, per-rank state, pid and progress, a barrier counter and
//!   generation, per-rank operation descriptors), one fixed-size data slot per rank, and one
//!   single-producer single-consumer ring per ordered pair of ranks (point-to-point); all shared
//!   fields are atomics, so ranks in different processes synchronise through them alone.
//! - The file is unlinked as soon as every rank has arrived (mappings stay valid), so a finished
//!   or failed rendezvous leaves nothing behind.
//! - Every wait has a deadline (the clique's timeout) and returns an error when it passes, when
//!   a peer process has died, or when a peer has left (destroyed or aborted its communicator, or
//!   failed); a rank that times out marks itself failed, so its peers stop waiting too. Nothing
//!   here hangs.

use std::ffi::CString;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Most ranks one communicator may have.
pub const MAX_RANKS: usize = 64;
/// Bytes of each rank's data slot by default (collectives move data through the slots in
/// chunks of this size).
pub const SLOT_BYTES: usize = 1 << 20;
/// Most bytes of each point-to-point ring (one per ordered pair of ranks).
pub const CHANNEL_BYTES: usize = 64 << 10;
/// Prefix of every unique id (and of its shared-memory file name).
pub const ID_PREFIX: &str = "kiln-emu-nccl-";

/// Why a communicator operation failed; each maps to one `ncclResult_t`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommError {
    /// Bad argument values (`ncclInvalidArgument`).
    InvalidArgument(String),
    /// Arguments inconsistent between ranks or calls out of order (`ncclInvalidUsage`).
    InvalidUsage(String),
    /// A peer died, failed or left (`ncclRemoteError`).
    Remote(String),
    /// A wait passed its deadline, or an operating-system call failed (`ncclSystemError`).
    System(String),
}

impl fmt::Display for CommError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (CommError::InvalidArgument(m)
        | CommError::InvalidUsage(m)
        | CommError::Remote(m)
        | CommError::System(m)) = self;
        f.write_str(m)
    }
}

/// Per-rank state values.
const ABSENT: u32 = 0;
const JOINED: u32 = 1;
const LEFT: u32 = 2;
const FAILED: u32 = 3;

/// Words of one operation descriptor.
pub const DESC_WORDS: usize = 4;

#[repr(C)]
struct Header {
    nranks: AtomicU32,
    slot_bytes: AtomicU32,
    arrived: AtomicU32,
    barrier_count: AtomicU32,
    barrier_generation: AtomicU32,
    state: [AtomicU32; MAX_RANKS],
    pid: [AtomicU32; MAX_RANKS],
    progress: [AtomicU64; MAX_RANKS],
    desc: [[AtomicU64; DESC_WORDS]; MAX_RANKS],
}

/// Bytes before the first data slot (the header, page-rounded).
const HEADER_BYTES: usize = (std::mem::size_of::<Header>() + 4095) & !4095;

/// One rank's mapping of a communicator's shared file.
pub struct Clique {
    base: *mut u8,
    len: usize,
    nranks: usize,
    slot_bytes: usize,
    channels_offset: usize,
    channel_bytes: usize,
    timeout: Duration,
    path: PathBuf,
}

// SAFETY: the mapping is shared memory accessed only through atomics (header) or within the
// barrier protocol (slots); the pointer stays valid until drop.
unsafe impl Send for Clique {}
// SAFETY: as above.
unsafe impl Sync for Clique {}

impl Drop for Clique {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are the mapping made in `open`, unmapped once.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

fn shm_dir() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}

/// The wait deadline from `KILN_EMU_NCCL_TIMEOUT` (seconds, default 60).
pub fn env_timeout() -> Duration {
    std::env::var("KILN_EMU_NCCL_TIMEOUT")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(Duration::from_secs(60), Duration::from_secs_f64)
}

/// A new unique name: the prefix and 32 random hex digits.
pub fn new_id_name() -> Result<String, CommError> {
    let mut bytes = [0u8; 16];
    // SAFETY: `bytes` is writable for its length.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if got != bytes.len() as isize {
        return Err(CommError::System(format!(
            "ncclGetUniqueId: getrandom failed: {}",
            std::io::Error::last_os_error()
        )));
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("{ID_PREFIX}{hex}"))
}

/// Whether `name` is one [`new_id_name`] makes.
pub fn valid_id_name(name: &str) -> bool {
    name.strip_prefix(ID_PREFIX)
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn pid_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

impl Clique {
    /// Opens (creating if needed) and maps the file of `id_name` for `nranks` ranks with data
    /// slots of `slot_bytes` (every rank must pass the same values).
    pub fn open(
        id_name: &str,
        nranks: usize,
        slot_bytes: usize,
        timeout: Duration,
    ) -> Result<Clique, CommError> {
        if !valid_id_name(id_name) {
            return Err(CommError::InvalidArgument(format!(
                "unique id {id_name:?} was not made by ncclGetUniqueId"
            )));
        }
        if nranks == 0 || nranks > MAX_RANKS {
            return Err(CommError::InvalidArgument(format!(
                "nranks {nranks} is not in 1..={MAX_RANKS}"
            )));
        }
        if slot_bytes < 8 || !slot_bytes.is_multiple_of(8) || slot_bytes > u32::MAX as usize {
            return Err(CommError::InvalidArgument(format!(
                "slot size {slot_bytes} is not a multiple of 8 in 8..2^32"
            )));
        }
        let path = shm_dir().join(id_name);
        let sys = |what: &str| {
            CommError::System(format!(
                "{what} {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            ))
        };
        let c_path = CString::new(path.as_os_str().as_encoded_bytes()).expect("no NUL in path");
        let channels_offset = HEADER_BYTES + nranks * slot_bytes;
        let channel_bytes = slot_bytes.min(CHANNEL_BYTES);
        let len = channels_offset + nranks * nranks * (64 + channel_bytes);
        // SAFETY: plain POSIX calls on a path we own; the fd is closed before returning.
        unsafe {
            let fd = libc::open(
                c_path.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
                0o600,
            );
            if fd < 0 {
                return Err(sys("open"));
            }
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd, &mut st) != 0
                || ((st.st_size as usize) < len && libc::ftruncate(fd, len as libc::off_t) != 0)
            {
                let e = sys("size");
                libc::close(fd);
                return Err(e);
            }
            let base = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            libc::close(fd);
            if base == libc::MAP_FAILED {
                return Err(sys("mmap"));
            }
            let clique = Clique {
                base: base.cast(),
                len,
                nranks,
                slot_bytes,
                channels_offset,
                channel_bytes,
                timeout,
                path,
            };
            let h = clique.header();
            for (field, mine, what) in [
                (&h.nranks, nranks, "nranks"),
                (&h.slot_bytes, slot_bytes, "slot size"),
            ] {
                match field.compare_exchange(0, mine as u32, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => {}
                    Err(theirs) if theirs as usize == mine => {}
                    Err(theirs) => {
                        return Err(CommError::InvalidUsage(format!(
                            "this rank says {what} {mine}, another rank of the same unique id \
                             said {theirs}"
                        )))
                    }
                }
            }
            Ok(clique)
        }
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping starts with a zero-initialised or peer-written Header of atomics.
        unsafe { &*(self.base as *const Header) }
    }

    /// Ranks in the communicator.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// The wait deadline of this clique.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Bytes of each data slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Start of `rank`'s data slot ([`Clique::slot_bytes`] bytes).
    pub fn slot(&self, rank: usize) -> *mut u8 {
        assert!(rank < self.nranks, "slot of rank {rank} of {}", self.nranks);
        // SAFETY: the slot lies inside the mapping.
        unsafe { self.base.add(HEADER_BYTES + rank * self.slot_bytes) }
    }

    /// Registers `rank` as arrived without waiting for the others.
    pub fn arrive(&self, rank: usize) -> Result<(), CommError> {
        if rank >= self.nranks {
            return Err(CommError::InvalidArgument(format!(
                "rank {rank} is not below nranks {}",
                self.nranks
            )));
        }
        let h = self.header();
        h.pid[rank].store(std::process::id(), Ordering::Relaxed);
        if h.state[rank]
            .compare_exchange(ABSENT, JOINED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(CommError::InvalidUsage(format!(
                "rank {rank} joined this unique id twice"
            )));
        }
        h.arrived.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Waits until every rank has arrived, then removes the file (rank 0).
    pub fn wait_arrivals(&self, rank: usize) -> Result<(), CommError> {
        let h = self.header();
        let result = self.wait_until(rank, "ncclCommInitRank", None, || {
            h.arrived.load(Ordering::Acquire) as usize >= self.nranks
        });
        if result.is_ok() && rank == 0 || result.is_err() {
            let _ = std::fs::remove_file(&self.path);
        }
        result
    }

    /// Marks `rank` as gone: peers waiting for it stop with an error instead of timing out.
    pub fn leave(&self, rank: usize, failed: bool) {
        let state = if failed { FAILED } else { LEFT };
        self.header().state[rank].store(state, Ordering::Release);
    }

    /// Publishes `rank`'s descriptor of the operation it is about to run.
    pub fn publish(&self, rank: usize, desc: [u64; DESC_WORDS]) {
        for (word, v) in self.header().desc[rank].iter().zip(desc) {
            word.store(v, Ordering::Relaxed);
        }
    }

    /// `rank`'s published descriptor (valid between the barrier after publishing and the next).
    pub fn descriptor(&self, rank: usize) -> [u64; DESC_WORDS] {
        let d = &self.header().desc[rank];
        std::array::from_fn(|i| d[i].load(Ordering::Relaxed))
    }

    /// Waits until every rank has entered this barrier (`what` names the operation for errors).
    pub fn barrier(&self, rank: usize, what: &str) -> Result<(), CommError> {
        let h = self.header();
        let generation = h.barrier_generation.load(Ordering::Acquire);
        let mine = h.progress[rank].fetch_add(1, Ordering::AcqRel) + 1;
        if h.barrier_count.fetch_add(1, Ordering::AcqRel) as usize + 1 == self.nranks {
            h.barrier_count.store(0, Ordering::Relaxed);
            h.barrier_generation.fetch_add(1, Ordering::AcqRel);
            return Ok(());
        }
        self.wait_until(rank, what, Some(mine), || {
            h.barrier_generation.load(Ordering::Acquire) != generation
        })
    }

    /// Polls `done` (with backoff) until it holds; errors on the deadline, a dead or departed
    /// peer. `progress`: this rank's barrier count (peers behind it are the ones waited for);
    /// `None` while waiting for arrivals.
    fn wait_until(
        &self,
        rank: usize,
        what: &str,
        progress: Option<u64>,
        done: impl Fn() -> bool,
    ) -> Result<(), CommError> {
        let h = self.header();
        let mut waiter = Waiter::new();
        loop {
            if done() {
                return Ok(());
            }
            let missing: Vec<usize> = (0..self.nranks)
                .filter(|&r| match progress {
                    None => h.state[r].load(Ordering::Acquire) == ABSENT,
                    Some(p) => h.progress[r].load(Ordering::Acquire) < p,
                })
                .collect();
            waiter.pause(self, rank, what, &missing)?;
        }
    }

    /// The point-to-point channel from `src` to `dst`: (bytes ever written, bytes ever read,
    /// ring of [`Clique::channel_bytes`] bytes).
    pub fn channel(&self, src: usize, dst: usize) -> (&AtomicU64, &AtomicU64, *mut u8) {
        assert!(
            src < self.nranks && dst < self.nranks,
            "channel {src} -> {dst}"
        );
        let index = src * self.nranks + dst;
        // SAFETY: the channel lies inside the mapping: a 64-byte header of two atomics, then
        // the ring.
        unsafe {
            let at = self
                .base
                .add(self.channels_offset + index * (64 + self.channel_bytes));
            let counters = &*(at as *const [AtomicU64; 2]);
            (&counters[0], &counters[1], at.add(64))
        }
    }

    /// Bytes of each point-to-point ring.
    pub fn channel_bytes(&self) -> usize {
        self.channel_bytes
    }
}

/// Backoff and failure checks of one wait: spins, then yields, then sleeps up to a millisecond
/// between polls; every 50 ms checks that the ranks waited for are alive.
pub struct Waiter {
    start: Instant,
    last_check: Instant,
    spins: u32,
}

impl Default for Waiter {
    fn default() -> Self {
        Waiter::new()
    }
}

impl Waiter {
    /// A wait starting now.
    pub fn new() -> Waiter {
        let now = Instant::now();
        Waiter {
            start: now,
            last_check: now,
            spins: 0,
        }
    }

    /// One pause of a wait for `missing` (by `rank`, in operation `what`): an error when one of
    /// them left, failed or died, or when the clique's timeout has passed (this rank is then
    /// marked failed, so its own peers stop waiting for it).
    pub fn pause(
        &mut self,
        clique: &Clique,
        rank: usize,
        what: &str,
        missing: &[usize],
    ) -> Result<(), CommError> {
        let h = clique.header();
        for &r in missing {
            let state = h.state[r].load(Ordering::Acquire);
            if state == LEFT || state == FAILED {
                let how = if state == LEFT {
                    "left the communicator"
                } else {
                    "failed"
                };
                clique.leave(rank, true);
                return Err(CommError::Remote(format!(
                    "{what}: rank {r} {how} before reaching this operation"
                )));
            }
        }
        let now = Instant::now();
        if now.duration_since(self.last_check) >= Duration::from_millis(50) {
            self.last_check = now;
            let me = std::process::id();
            for &r in missing {
                let pid = h.pid[r].load(Ordering::Relaxed);
                if pid != 0 && pid != me && !pid_alive(pid) {
                    clique.leave(rank, true);
                    return Err(CommError::Remote(format!(
                        "{what}: rank {r} (process {pid}) died"
                    )));
                }
            }
        }
        if now.duration_since(self.start) >= clique.timeout {
            clique.leave(rank, true);
            return Err(CommError::System(format!(
                "{what}: timed out after {:.1} s waiting for rank(s) {missing:?} \
                 (KILN_EMU_NCCL_TIMEOUT)",
                clique.timeout.as_secs_f64()
            )));
        }
        self.spins += 1;
        if self.spins < 64 {
            std::hint::spin_loop();
        } else if self.spins < 256 {
            std::thread::yield_now();
        } else {
            let micros = (self.spins as u64 - 255).min(1000);
            std::thread::sleep(Duration::from_micros(micros));
        }
        Ok(())
    }
}
