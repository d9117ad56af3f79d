//! The CPU thread pool every parallel kernel runs on.
//!
//! One rayon pool, built on first use. `KILN_NUM_THREADS=N` caps it at `N` threads (like
//! `OMP_NUM_THREADS` for PyTorch); unset, it uses every core rayon sees. Kernels below
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

/// The pool (built on first call, honouring `KILN_NUM_THREADS`).
pub fn cpu_pool() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        let raw = std::env::var("KILN_NUM_THREADS").ok();
        let requested = parse_num_threads(raw.as_deref());
        if raw.is_some() && requested.is_none() {
            eprintln!(
                "kiln: ignoring KILN_NUM_THREADS={:?}: expected a positive integer such as 4",
                raw.unwrap_or_default()
            );
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
    fn parses_thread_counts() {
        assert_eq!(parse_num_threads(Some("4")), Some(4));
        assert_eq!(parse_num_threads(Some(" 2 ")), Some(2));
        assert_eq!(parse_num_threads(Some("0")), None);
        assert_eq!(parse_num_threads(Some("many")), None);
        assert_eq!(parse_num_threads(None), None);
    }
}
