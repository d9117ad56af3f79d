//! Errors of `kiln-distributed`. Every message names the rank, the collective and the fix.

/// Everything that can go wrong in `kiln-distributed`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The launch environment is missing or inconsistent (`RANK`, `WORLD_SIZE`, ...).
    #[error("distributed launch environment: {0}")]
    Environment(String),
    /// A collective failed on this rank, or was refused before it started.
    #[error("rank {rank} of {world_size}: {op}: {msg}")]
    Collective {
        /// This process's rank.
        rank: usize,
        /// The group's size.
        world_size: usize,
        /// The collective (`all_reduce`, `broadcast`, ...).
        op: &'static str,
        /// What went wrong and what to do.
        msg: String,
    },
    /// A collective did not finish within the group's timeout (a peer died or diverged).
    #[error(
        "rank {rank} of {world_size}: {op} did not finish within {seconds} s; a peer rank \
         exited or issues different collectives (check every rank's log; raise the timeout \
         with KILN_DIST_TIMEOUT if a step is legitimately slower)"
    )]
    Timeout {
        /// This process's rank.
        rank: usize,
        /// The group's size.
        world_size: usize,
        /// The collective.
        op: &'static str,
        /// The timeout that expired.
        seconds: f64,
    },
    /// A backend this build or machine does not have (MPI without the `mpi` feature, ...).
    #[error("{0}")]
    Unavailable(String),
    /// A bad argument (a tensor on the wrong device, a root rank out of range, ...).
    #[error("{op}: {msg}")]
    InvalidArgument {
        /// The function.
        op: &'static str,
        /// What was wrong and what to pass instead.
        msg: String,
    },
    /// An error from a tensor operation.
    #[error(transparent)]
    Autograd(#[from] kiln_autograd::Error),
    /// An error from the wrapped model's forward.
    #[error(transparent)]
    Model(#[from] kiln_models::Error),
    /// An error from an optimizer step (ZeRO-1).
    #[error(transparent)]
    Optim(#[from] kiln_optim::Error),
    /// DistributedDataParallel used out of order, or a parameter that got no gradient.
    #[error("rank {rank}: DistributedDataParallel: {msg}")]
    Ddp {
        /// This process's rank.
        rank: usize,
        /// What happened and the fix.
        msg: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
