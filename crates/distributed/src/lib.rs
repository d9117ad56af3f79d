//! Data-parallel training for kiln: one process per device, gradients averaged across them.
//!
//! Invariants every part of this crate keeps:
//! - A [`ProcessGroup`] is one process's handle on a fixed set of `world_size` processes, each
//!   with a distinct `rank` in `0..world_size`. Every rank issues the same collectives in the
//!   same order with tensors of the same shape, dtype and device kind; a mismatch is an error
//!   naming the rank, never a hang or wrong numbers.
//! - Collectives work in place on contiguous tensors and finish (or fail) within the group's
//!   timeout; a rank that died makes the others fail with an error naming it.
//! - The transports are the ones the field trusts: NCCL for CUDA devices, MPI for CPU hosts.
//!   kiln only bootstraps them (sharing NCCL's unique id) and never moves tensor bytes itself;
//!   the one exception is [`ThreadGroup`], ranks as threads of one process, for tests and
//!   single-host experiments.
//! - Reductions have a fixed order for a fixed world size, so a run is reproducible.
//!
//! On top of the groups: [`DistributedDataParallel`] (gradients bucketed and all-reduced while
//! backward runs, from `kiln-autograd`'s post-accumulate-grad hooks), [`SyncBatchNorm`] and
//! [`ZeroRedundancyOptimizer`] (ZeRO stage 1). docs/DISTRIBUTED.md describes the design.

#[cfg(any(feature = "mpi", feature = "cuda"))]
mod collective;
pub mod ddp;
pub mod env;
mod error;
mod group;
mod init;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "cuda")]
mod nccl;
#[cfg(any(feature = "mpi", feature = "cuda"))]
mod signature;
pub mod store;
pub mod sync_bn;
mod threads;
pub mod zero;

pub use ddp::{DdpOptions, DistributedDataParallel, NoSyncGuard, SyncStats};
pub use env::{LaunchEnv, Launcher};
pub use error::{Error, Result};
pub use group::{BackendKind, PendingWork, ProcessGroup, ReduceOp};
pub use init::{init_process_group, init_process_group_with, MPI_REBUILD_HINT};
#[cfg(feature = "mpi")]
pub use mpi::MpiGroup;
#[cfg(feature = "cuda")]
pub use nccl::{NcclGroup, NCCL_INSTALL_HINT};
pub use sync_bn::{convert_sync_batchnorm, SyncBatchNorm};
pub use threads::{ThreadGroup, DEFAULT_THREAD_TIMEOUT};
pub use zero::ZeroRedundancyOptimizer;
