//! The CPU thread pool every parallel kernel runs on.
//!
//! One rayon pool, built on first use. `KILN_NUM_THREADS=N` caps it at `N` threads (like
//! `OMP_NUM_THREADS` for PyTorch); unset, it uses every core rayon sees. `N` itself is capped at
//! [`MAX_THREADS_PER_CORE`] times the cores the machine has (more threads than that only add
//! scheduling cost, and a typo such as 100000 would spend minutes spawning them); a value that
//! is capped or not a positive integer is reported on stderr, naming the variable and the fix,
//! and the pool is still built. Kernels below
//! [`PARALLEL_THRESHOLD`] elements run on the calling thread: handing tiny loops to the pool costs
//! more than it saves.

use std::sync::OnceLock;

/// Element count above which elementwise and reduction kernels split work across the pool.
pub const PARALLEL_THRESHOLD: usize = 1 << 15;

/// Parses a `KILN_NUM_THREADS` value: a positive integer, or `None` (use every core).
pub fn parse_num_threads(value: Option<&str>) -> Option<usize> {
    value
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
}

/// `KILN_NUM_THREADS` may ask for at most this many threads per core of the machine.
pub const MAX_THREADS_PER_CORE: usize = 4;

/// The thread count to build the pool with from a raw `KILN_NUM_THREADS` value on a machine
/// with `cores` cores: `(threads, warning)`. `threads` is `None` (use every core) when the
/// variable is unset or not a positive integer, and at most `MAX_THREADS_PER_CORE * cores`;
/// `warning` says what was ignored or capped and how to fix the variable.
pub fn resolve_num_threads(raw: Option<&str>, cores: usize) -> (Option<usize>, Option<String>) {
    let Some(text) = raw else {
        return (None, None);
    };
    let Some(requested) = parse_num_threads(Some(text)) else {
        let shown: String = text.chars().take(40).collect();
        return (
            None,
            Some(format!(
                "kiln: ignoring KILN_NUM_THREADS={shown:?}: expected a positive integer such as 4; \
                 using every core"
            )),
        );
    };
    let cores = cores.max(1);
    let limit = cores.saturating_mul(MAX_THREADS_PER_CORE);
    if requested > limit {
        let warning = format!(
            "kiln: KILN_NUM_THREADS={requested} is more than {MAX_THREADS_PER_CORE} threads per \
             core ({cores} cores here); using {limit} threads: set KILN_NUM_THREADS to at most \
             {limit}, or unset it to use one thread per core"
        );
        return (Some(limit), Some(warning));
    }
    (Some(requested), None)
}

/// Runs `f` in kiln's CPU pool with the calling thread's allocation context (op, module path,
/// category) carried in, so what the kernel allocates on the pool's threads is attributed to
/// the op that ran it when an allocation history is recorded (one relaxed atomic load when
/// nothing records), and with the calling thread's [`StepThread`] entered, so what `f` itself
/// allocates belongs to the caller's planned steps (a kernel's parallel tasks keep their
/// scratch out of them).
///
/// [`StepThread`]: kiln_alloc_cache::StepThread
///
/// Only a `dyn` call crosses into rayon, so its job machinery is compiled once rather than once
/// per kernel closure (copies of it were a large share of this crate's build time).
pub fn install<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let mut f = Some(f);
    let mut result = None;
    install_erased(&mut || {
        if let Some(f) = f.take() {
            result = Some(f());
        }
    });
    // `install_erased` runs the closure exactly once or unwinds with its panic.
    result.expect("the pool ran the kernel")
}

fn install_erased(f: &mut (dyn FnMut() + Send)) {
    let context = kiln_alloc_cache::AllocContext::is_recording_anywhere()
        .then(kiln_alloc_cache::AllocContext::current);
    let step_thread = kiln_alloc_cache::StepThread::current();
    cpu_pool().install(move || {
        let _context = context.as_ref().map(kiln_alloc_cache::AllocContext::enter);
        let _step_thread = step_thread.enter();
        f()
    })
}

/// Handles now held that keep whole passes off the pool (see [`OpByOp`]).
static OP_BY_OP: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// While one is held anywhere in the process, a whole forward or backward pass is not handed to
/// the pool (`kiln_autograd::on_cpu_pool` runs it on the calling thread, which hands the pool
/// one op at a time). Ranks that run as threads of one process hold one each: a rank blocked in
/// a collective inside a pass would then block a pool thread, and the other ranks' kernels
/// could not run (with a one-thread pool, never).
#[derive(Debug)]
pub struct OpByOp(());

impl OpByOp {
    /// Holds whole passes off the pool until dropped.
    pub fn hold() -> Self {
        OP_BY_OP.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        OpByOp(())
    }
}

impl Drop for OpByOp {
    fn drop(&mut self) {
        OP_BY_OP.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// False while an [`OpByOp`] is held.
pub fn passes_may_run_on_pool() -> bool {
    OP_BY_OP.load(std::sync::atomic::Ordering::SeqCst) == 0
}

/// The pool (built on first call, honouring `KILN_NUM_THREADS`).
pub fn cpu_pool() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        let raw = std::env::var("KILN_NUM_THREADS").ok();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (requested, warning) = resolve_num_threads(raw.as_deref(), cores);
        if let Some(warning) = warning {
            eprintln!("{warning}");
        }
        let mut builder = rayon::ThreadPoolBuilder::new().thread_name(|i| format!("kiln-cpu-{i}"));
        if let Some(n) = requested {
            builder = builder.num_threads(n);
        }
        builder.build().unwrap_or_else(|_| {
            // Building can only fail if the OS refuses threads; fall back to one thread.
            rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .expect("a one-thread pool")
        })
    })
}

/// Number of threads in [`cpu_pool`].
pub fn num_threads() -> usize {
    cpu_pool().current_num_threads()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_allocates_for_the_calling_thread_planned_steps() {
        use kiln_alloc_cache::StepThread;
        let caller = StepThread::current();
        let (on_pool, there) = install(|| {
            (
                cpu_pool().current_thread_index().is_some(),
                StepThread::current(),
            )
        });
        assert!(on_pool);
        assert_eq!(there, caller);
        // What the pool thread is after the closure: its own again.
        let after = cpu_pool().install(StepThread::current);
        assert_ne!(after, caller);
    }

    #[test]
    fn parses_thread_counts() {
        assert_eq!(parse_num_threads(Some("4")), Some(4));
        assert_eq!(parse_num_threads(Some(" 2 ")), Some(2));
        assert_eq!(parse_num_threads(Some("0")), None);
        assert_eq!(parse_num_threads(Some("many")), None);
        assert_eq!(parse_num_threads(None), None);
    }

    #[test]
    fn caps_huge_thread_counts_with_a_message_naming_the_variable() {
        assert_eq!(resolve_num_threads(Some("8"), 4), (Some(8), None));
        assert_eq!(resolve_num_threads(None, 4), (None, None));
        let (n, warning) = resolve_num_threads(Some("100000"), 4);
        assert_eq!(n, Some(4 * MAX_THREADS_PER_CORE));
        let warning = warning.expect("a capped count is reported");
        assert!(
            warning.contains("KILN_NUM_THREADS=100000") && warning.contains("at most 16"),
            "{warning}"
        );
        let (n, warning) = resolve_num_threads(Some("99999999999999999999999"), 2);
        assert_eq!(n, None);
        assert!(warning.unwrap().contains("positive integer"));
        // No cores reported still leaves a usable limit.
        assert_eq!(resolve_num_threads(Some("3"), 0).0, Some(3));
    }
}
