//! Runs a grid's blocks on several OS threads at once: the launching thread and helper threads
//! of a process-wide pool (`KILN_EMU_THREADS`, default: the available parallelism, at most 8), so atomics
//! and inter-block protocols (last-block reductions) are exercised for real.
//!
//! Invariants:
//! - Blocks are handed out by one shared counter; a launch returns only after every block
//!   someone took has finished (the helper count is raised before a helper takes a block), so
//!   the arguments the blocks read outlive every reader.
//! - A failing block raises the abort flag; blocks not yet started are skipped; the first
//!   error is the launch's error.
//! - Each thread keeps its fiber stacks between launches (one region per block thread, its
//!   lowest page inaccessible so a fiber's stack overflow faults).

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use super::abi::{Launch, RunBlocks, RUN_OK};
use super::fault;

/// Bytes of one fiber's stack region, its guard page included.
const STACK_STRIDE: usize = 256 * 1024;
const GUARD_BYTES: usize = 4096;
/// Default cap on the OS threads of one launch: each keeps a stack (and a guard mapping) per
/// block thread, and more threads than this add mappings faster than they add coverage.
const DEFAULT_MAX_THREADS: usize = 8;

/// One thread's fiber stacks.
struct Stacks {
    base: *mut u8,
    count: usize,
}

impl Stacks {
    /// Makes room for `count` fibers; false when the memory cannot be had.
    fn reserve(&mut self, count: usize) -> bool {
        if count <= self.count {
            return true;
        }
        self.release();
        let len = count * STACK_STRIDE;
        // SAFETY: a fresh private mapping; the guard pages are inside it.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            );
            if base == libc::MAP_FAILED {
                return false;
            }
            for i in 0..count {
                libc::mprotect(
                    (base as *mut u8).add(i * STACK_STRIDE) as *mut c_void,
                    GUARD_BYTES,
                    libc::PROT_NONE,
                );
            }
            self.base = base as *mut u8;
        }
        self.count = count;
        true
    }

    fn release(&mut self) {
        if self.count > 0 {
            // SAFETY: unmaps exactly the mapping `reserve` made; no fiber runs on it now.
            unsafe { libc::munmap(self.base as *mut c_void, self.count * STACK_STRIDE) };
            self.count = 0;
        }
    }
}

impl Drop for Stacks {
    fn drop(&mut self) {
        self.release();
    }
}

thread_local! {
    static STACKS: std::cell::RefCell<Stacks> =
        const { std::cell::RefCell::new(Stacks { base: std::ptr::null_mut(), count: 0 }) };
}

/// Everything the threads of one launch share.
pub struct Grid {
    /// The runner of the module the kernel lives in.
    pub run_blocks: RunBlocks,
    /// The module's `dlopen` handle (for its thread-local block).
    pub dl_handle: *mut c_void,
    /// Bytes of the module's thread-local block (its shared memory).
    pub tls_size: usize,
    /// The kernel's entry point.
    pub entry: unsafe extern "C" fn(*const *mut c_void),
    /// One pointer per parameter into the captured arguments.
    pub args: *const *mut c_void,
    /// Grid and block dimensions.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
    /// `KILN_EMU_SCHEDULE`: 0 in order, 1 reverse, 2 random.
    pub schedule: u32,
    /// Seed of the random schedule.
    pub seed: u64,
}

struct Job {
    grid: Grid,
    total: u64,
    next: AtomicU64,
    abort: AtomicI32,
    helpers: AtomicUsize,
    error: Mutex<Option<(c_int, String)>>,
    done: Condvar,
}

// SAFETY: the raw pointers in `Grid` are read-only for the launch's duration, and the launching
// thread waits for every helper that took a block (see the file comment).
unsafe impl Send for Job {}
// SAFETY: as above.
unsafe impl Sync for Job {}

impl Job {
    /// Runs blocks on the calling thread until none are left.
    fn work(&self) {
        let outcome = fault::with_slot(|slot| {
            let Some(slot) = slot else {
                return Err((
                    super::abi::RUN_FAILED,
                    "too many threads run kernels at once for the fault table".to_string(),
                ));
            };
            let threads = (self.grid.block[0] * self.grid.block[1] * self.grid.block[2]) as usize;
            STACKS.with(|stacks| {
                let mut stacks = stacks.borrow_mut();
                if !stacks.reserve(threads) {
                    return Err((
                        super::abi::RUN_FAILED,
                        format!("cannot map stacks for {threads} threads"),
                    ));
                }
                let mut launch = Launch {
                    abi: super::abi::ABI,
                    schedule: self.grid.schedule,
                    seed: self.grid.seed,
                    entry: self.grid.entry,
                    args: self.grid.args,
                    grid: self.grid.grid,
                    block: self.grid.block,
                    dl_handle: self.grid.dl_handle,
                    tls_size: self.grid.tls_size,
                    stacks: stacks.base,
                    stack_stride: STACK_STRIDE,
                    guard_bytes: GUARD_BYTES,
                    next_block: &self.next,
                    total_blocks: self.total,
                    abort_flag: &self.abort,
                    slot,
                    code: 0,
                    padding: 0,
                    message: [0; 1024],
                };
                // SAFETY: `launch` describes live memory for the call; the runner is the
                // module's kiln_emu_run_blocks with the matching ABI (checked at load).
                let code = unsafe { (self.grid.run_blocks)(&mut launch) };
                if code == RUN_OK {
                    return Ok(());
                }
                let bytes: Vec<u8> = launch
                    .message
                    .iter()
                    .map(|&c| c as u8)
                    .take_while(|&b| b != 0)
                    .collect();
                Err((code, String::from_utf8_lossy(&bytes).into_owned()))
            })
        });
        if let Err(e) = outcome {
            self.abort.store(1, Ordering::SeqCst);
            let mut first = self.error.lock().unwrap_or_else(|p| p.into_inner());
            first.get_or_insert(e);
        }
    }
}

struct Pool {
    queue: Mutex<VecDeque<Arc<Job>>>,
    wake: Condvar,
    helpers: usize,
}

fn thread_count() -> usize {
    std::env::var("KILN_EMU_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, |n| n.get().min(DEFAULT_MAX_THREADS))
        })
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<&'static Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            queue: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            helpers: thread_count().saturating_sub(1),
        }));
        for i in 0..pool.helpers {
            let _ = std::thread::Builder::new()
                .name(format!("kiln-emu-block-{i}"))
                .spawn(move || helper(pool));
        }
        pool
    })
}

fn helper(pool: &'static Pool) {
    loop {
        let job = {
            let mut queue = pool.queue.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if let Some(job) = queue.pop_front() {
                    break job;
                }
                queue = pool.wake.wait(queue).unwrap_or_else(|p| p.into_inner());
            }
        };
        job.helpers.fetch_add(1, Ordering::SeqCst);
        if job.next.load(Ordering::SeqCst) < job.total {
            job.work();
        }
        let _guard = job.error.lock().unwrap_or_else(|p| p.into_inner());
        job.helpers.fetch_sub(1, Ordering::SeqCst);
        job.done.notify_all();
    }
}

/// Runs every block of `grid`; returns the runner's code and message of the first failure.
pub fn run_grid(grid: Grid) -> Result<(), (c_int, String)> {
    fault::install();
    let total = grid.grid.iter().map(|&d| d as u64).product::<u64>();
    let job = Arc::new(Job {
        grid,
        total,
        next: AtomicU64::new(0),
        abort: AtomicI32::new(0),
        helpers: AtomicUsize::new(0),
        error: Mutex::new(None),
        done: Condvar::new(),
    });
    let pool = pool();
    let wanted = (total.min(pool.helpers as u64 + 1) as usize).saturating_sub(1);
    if wanted > 0 {
        let mut queue = pool.queue.lock().unwrap_or_else(|p| p.into_inner());
        for _ in 0..wanted {
            queue.push_back(job.clone());
        }
        drop(queue);
        pool.wake.notify_all();
    }
    job.work();
    let mut error = job.error.lock().unwrap_or_else(|p| p.into_inner());
    while job.helpers.load(Ordering::SeqCst) > 0 {
        error = job.done.wait(error).unwrap_or_else(|p| p.into_inner());
    }
    match error.take() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
