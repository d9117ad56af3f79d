//! [`init_process_group`]: the process group for this process's device, from the launch
//! environment: NCCL for a CUDA device, MPI for the CPU.
//!
//! Invariants: the choice depends only on the device and the build's features; a backend the
//! build lacks is an [`Error::Unavailable`] saying how to rebuild, never a panic; the timeout
//! comes from `KILN_DIST_TIMEOUT` ([`crate::env::timeout_from_vars`]).

use crate::env::{process_vars, timeout_from_vars, LaunchEnv};
use crate::{Error, ProcessGroup, Result};
use kiln_autograd::Device;
use std::sync::Arc;
use std::time::Duration;

/// How to rebuild with the MPI backend.
pub const MPI_REBUILD_HINT: &str = "this build of kiln has no MPI backend: install Open MPI \
     (apt-get install openmpi-bin libopenmpi-dev libclang-dev) and rebuild with the `mpi` \
     feature, e.g. `cargo build --release --features mpi --example train`";

/// The process group of this process, for tensors on `device` (`cuda:local_rank` for NCCL, the
/// CPU for MPI), from the launch environment of this process.
pub fn init_process_group(device: Device) -> Result<Arc<dyn ProcessGroup>> {
    let vars = process_vars();
    let env = LaunchEnv::from_vars(&vars)?;
    let timeout = timeout_from_vars(&vars)?;
    init_process_group_with(&env, device, timeout)
}

/// [`init_process_group`] with an explicit launch environment and collective timeout.
pub fn init_process_group_with(
    env: &LaunchEnv,
    device: Device,
    timeout: Duration,
) -> Result<Arc<dyn ProcessGroup>> {
    match device {
        Device::Cuda(ordinal) => nccl_group(env, ordinal, timeout),
        Device::Cpu => mpi_group(env, timeout),
    }
}

#[cfg(feature = "cuda")]
fn nccl_group(env: &LaunchEnv, ordinal: usize, timeout: Duration) -> Result<Arc<dyn ProcessGroup>> {
    Ok(Arc::new(crate::nccl::NcclGroup::new(
        env, ordinal, timeout,
    )?))
}

#[cfg(not(feature = "cuda"))]
fn nccl_group(_: &LaunchEnv, ordinal: usize, _: Duration) -> Result<Arc<dyn ProcessGroup>> {
    Err(Error::Unavailable(format!(
        "cuda:{ordinal} needs the NCCL backend, which this build lacks: rebuild kiln with its \
         `cuda` feature (on by default)"
    )))
}

/// Refuses a multi-process CPU job that no MPI launcher started: every process would
/// initialise MPI alone and see a world of one.
fn check_mpi_launch(env: &LaunchEnv) -> Result<()> {
    use crate::env::Launcher;
    if env.is_distributed() && matches!(env.launcher, Launcher::Torchrun) {
        return Err(Error::Environment(format!(
            "the CPU backend is MPI, but this process was started by torchrun (RANK={} \
             WORLD_SIZE={}), which MPI cannot join: launch with `mpirun -np {} ...`, or train on \
             CUDA devices (NCCL) under torchrun",
            env.rank, env.world_size, env.world_size
        )));
    }
    Ok(())
}

#[cfg(feature = "mpi")]
fn mpi_group(env: &LaunchEnv, timeout: Duration) -> Result<Arc<dyn ProcessGroup>> {
    check_mpi_launch(env)?;
    Ok(Arc::new(crate::mpi::MpiGroup::new(env, timeout)?))
}

#[cfg(not(feature = "mpi"))]
fn mpi_group(env: &LaunchEnv, _: Duration) -> Result<Arc<dyn ProcessGroup>> {
    check_mpi_launch(env)?;
    Err(Error::Unavailable(MPI_REBUILD_HINT.into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::Launcher;

    #[test]
    fn torchrun_on_the_cpu_is_refused_with_the_mpirun_command() {
        let env = LaunchEnv {
            rank: 1,
            world_size: 2,
            local_rank: 1,
            master_addr: None,
            master_port: None,
            launcher: Launcher::Torchrun,
        };
        let err = init_process_group_with(&env, Device::Cpu, Duration::from_secs(1))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("mpirun -np 2"), "{err}");
    }

    #[cfg(not(feature = "mpi"))]
    #[test]
    fn a_build_without_mpi_says_how_to_rebuild() {
        let err =
            init_process_group_with(&LaunchEnv::single(), Device::Cpu, Duration::from_secs(1))
                .err()
                .unwrap();
        assert!(matches!(err, Error::Unavailable(_)));
        assert!(
            err.to_string().contains("--features mpi --example train"),
            "{err}"
        );
    }
}
