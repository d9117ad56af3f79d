//! The launch environment: which rank this process is, of how many, on which local device, and
//! where rank 0 listens, read from the variables a launcher sets.
//!
//! Invariants: [`LaunchEnv::from_vars`] is a pure function of the variables it is given (the
//! unit tests feed it maps); whatever it returns has `rank < world_size` and
//! `local_rank < world_size`; every malformed or inconsistent value is an
//! [`Error::Environment`] naming the variable, its value and the fix; no launcher variable at
//! all is a single process (rank 0 of 1).
//!
//! Launchers, in the order they are trusted:
//! - torchrun (and hand-set environments): `RANK`, `WORLD_SIZE`, `LOCAL_RANK`;
//! - Open MPI's `mpirun`: `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`,
//!   `OMPI_COMM_WORLD_LOCAL_RANK`;
//! - MPICH / Intel MPI (PMI): `PMI_RANK`, `PMI_SIZE`, `MPI_LOCALRANKID`;
//! - Slurm's `srun`: `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`.
//!
//! When torchrun's and an MPI launcher's variables are both present they must agree, else the
//! job would pair the wrong processes. Slurm's are read only when no other launcher set its
//! own: `mpirun` inside an allocation leaves the allocation's `SLURM_*` values (those of its
//! daemons, not of the ranks) in every rank's environment.
//! `MASTER_ADDR` / `MASTER_PORT` (rank 0's address, for NCCL's bootstrap) are optional.

use crate::{Error, Result};
use std::collections::BTreeMap;
use std::time::Duration;

/// What started this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// No launcher: one process, rank 0 of 1.
    Single,
    /// torchrun, or `RANK` / `WORLD_SIZE` set by hand.
    Torchrun,
    /// Open MPI's `mpirun` / `mpiexec`.
    OpenMpi,
    /// An MPICH-family `mpiexec` (the PMI variables).
    Pmi,
    /// Slurm's `srun`.
    Slurm,
}

impl Launcher {
    /// True for the launchers that start an MPI job (so MPI can be initialised).
    pub fn is_mpi(self) -> bool {
        matches!(self, Launcher::OpenMpi | Launcher::Pmi)
    }
}

/// This process's place in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    /// This process's rank, `0..world_size`.
    pub rank: usize,
    /// The number of processes.
    pub world_size: usize,
    /// The rank among the processes on this host: the CUDA device this process uses.
    pub local_rank: usize,
    /// Rank 0's host (`MASTER_ADDR`), if set.
    pub master_addr: Option<String>,
    /// Rank 0's bootstrap port (`MASTER_PORT`), if set.
    pub master_port: Option<u16>,
    /// The launcher whose variables gave the rank.
    pub launcher: Launcher,
}

/// The variable names of one launcher.
struct Names {
    launcher: Launcher,
    rank: &'static str,
    size: &'static str,
    local: &'static str,
}

const TORCHRUN: Names = Names {
    launcher: Launcher::Torchrun,
    rank: "RANK",
    size: "WORLD_SIZE",
    local: "LOCAL_RANK",
};
const OPEN_MPI: Names = Names {
    launcher: Launcher::OpenMpi,
    rank: "OMPI_COMM_WORLD_RANK",
    size: "OMPI_COMM_WORLD_SIZE",
    local: "OMPI_COMM_WORLD_LOCAL_RANK",
};
const PMI: Names = Names {
    launcher: Launcher::Pmi,
    rank: "PMI_RANK",
    size: "PMI_SIZE",
    local: "MPI_LOCALRANKID",
};
const SLURM: Names = Names {
    launcher: Launcher::Slurm,
    rank: "SLURM_PROCID",
    size: "SLURM_NTASKS",
    local: "SLURM_LOCALID",
};

/// The variable that sets the collective timeout, in seconds.
pub const TIMEOUT_VAR: &str = "KILN_DIST_TIMEOUT";
/// The collective timeout when [`TIMEOUT_VAR`] is unset.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

fn env_err(msg: String) -> Error {
    Error::Environment(msg)
}

/// `name`'s value as a whole number, if set.
fn number(vars: &BTreeMap<String, String>, name: &str) -> Result<Option<usize>> {
    let Some(text) = vars.get(name) else {
        return Ok(None);
    };
    text.trim().parse::<usize>().map(Some).map_err(|_| {
        env_err(format!(
            "{name}={text:?} is not a whole number; the launcher sets it to this process's \
             place in the job: unset it, or set it to a number such as 0"
        ))
    })
}

/// One launcher's reading, if any of its variables is set.
fn read(vars: &BTreeMap<String, String>, names: &Names) -> Result<Option<LaunchEnv>> {
    let rank = number(vars, names.rank)?;
    let size = number(vars, names.size)?;
    let local = number(vars, names.local)?;
    let (rank, world_size) = match (rank, size) {
        (None, None) if local.is_none() => return Ok(None),
        (Some(r), Some(s)) => (r, s),
        _ => {
            let missing = if rank.is_none() {
                names.rank
            } else {
                names.size
            };
            return Err(env_err(format!(
                "{missing} is unset while other {:?} variables are set ({}, {}, {} go \
                 together): set it, or unset the others to run one process",
                names.launcher, names.rank, names.size, names.local
            )));
        }
    };
    if world_size == 0 {
        return Err(env_err(format!(
            "{}=0: a job has at least one process; set it to the number of processes",
            names.size
        )));
    }
    if rank >= world_size {
        return Err(env_err(format!(
            "{}={rank} is not below {}={world_size}: ranks run from 0 to {}; check the \
             launch command",
            names.rank,
            names.size,
            world_size - 1
        )));
    }
    // A hand-set RANK / WORLD_SIZE without LOCAL_RANK means one host: the rank is the device.
    let local_rank = local.unwrap_or(rank);
    if local_rank >= world_size {
        return Err(env_err(format!(
            "{}={local_rank} is not below {}={world_size}: a host cannot run more processes \
             than the job has; check the launch command",
            names.local, names.size
        )));
    }
    Ok(Some(LaunchEnv {
        rank,
        world_size,
        local_rank,
        master_addr: None,
        master_port: None,
        launcher: names.launcher,
    }))
}

/// Refuses two launchers' readings that name different places in the job.
fn check_agree(a: &LaunchEnv, an: &Names, b: &LaunchEnv, bn: &Names) -> Result<()> {
    if a.rank != b.rank || a.world_size != b.world_size {
        return Err(env_err(format!(
            "two launchers disagree: {}={} {}={} but {}={} {}={}; a stale environment from \
             another launcher is set: unset {} and {} (or launch with one launcher only)",
            an.rank,
            a.rank,
            an.size,
            a.world_size,
            bn.rank,
            b.rank,
            bn.size,
            b.world_size,
            an.rank,
            an.size
        )));
    }
    Ok(())
}

impl LaunchEnv {
    /// One process, rank 0 of 1.
    pub fn single() -> Self {
        LaunchEnv {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            master_addr: None,
            master_port: None,
            launcher: Launcher::Single,
        }
    }

    /// Reads the launch environment from `vars` (variable name to value); see the module docs
    /// for the launchers and the rules.
    pub fn from_vars(vars: &BTreeMap<String, String>) -> Result<Self> {
        let torchrun = read(vars, &TORCHRUN)?;
        let open_mpi = read(vars, &OPEN_MPI)?;
        let pmi = read(vars, &PMI)?;
        if let (Some(t), Some(m)) = (&torchrun, &open_mpi) {
            check_agree(t, &TORCHRUN, m, &OPEN_MPI)?;
        }
        if let (Some(t), Some(p)) = (&torchrun, &pmi) {
            check_agree(t, &TORCHRUN, p, &PMI)?;
        }
        if let (Some(m), Some(p)) = (&open_mpi, &pmi) {
            check_agree(p, &PMI, m, &OPEN_MPI)?;
        }
        // An MPI launcher's reading wins over torchrun's (they agree; MPI's local rank and its
        // name are the more exact ones), and Slurm's is the last resort.
        let chosen = match open_mpi.or(pmi).or(torchrun) {
            Some(env) => Some(env),
            None => read(vars, &SLURM)?,
        };
        let mut env = chosen.unwrap_or_else(LaunchEnv::single);
        env.master_addr = vars
            .get("MASTER_ADDR")
            .map(|a| a.trim().to_string())
            .filter(|a| !a.is_empty());
        env.master_port = match vars.get("MASTER_PORT") {
            None => None,
            Some(text) => match text.trim().parse::<u16>() {
                Ok(p) if p > 0 => Some(p),
                _ => {
                    return Err(env_err(format!(
                        "MASTER_PORT={text:?} is not a port number (1 to 65535); set it to a \
                         free TCP port on rank 0's host, such as 29500"
                    )))
                }
            },
        };
        Ok(env)
    }

    /// Reads the launch environment of this process ([`LaunchEnv::from_vars`] over
    /// `std::env::vars`).
    pub fn from_process_env() -> Result<Self> {
        Self::from_vars(&process_vars())
    }

    /// True when more than one process takes part.
    pub fn is_distributed(&self) -> bool {
        self.world_size > 1
    }
}

/// The variables of this process (those that are valid Unicode).
pub fn process_vars() -> BTreeMap<String, String> {
    std::env::vars().collect()
}

/// The collective timeout from [`TIMEOUT_VAR`] in `vars` (seconds, from a millisecond to
/// 1e9: a shorter one, such as `1e-300`, would be a timeout of zero that fails every
/// collective at once), [`DEFAULT_TIMEOUT`] when unset.
pub fn timeout_from_vars(vars: &BTreeMap<String, String>) -> Result<Duration> {
    let Some(text) = vars.get(TIMEOUT_VAR) else {
        return Ok(DEFAULT_TIMEOUT);
    };
    match text.trim().parse::<f64>() {
        Ok(s) if (1e-3..=1e9).contains(&s) => Ok(Duration::from_secs_f64(s)),
        _ => Err(env_err(format!(
            "{TIMEOUT_VAR}={text:?} is not a number of seconds from 0.001 to 1e9; set it to how \
             long a collective may wait for its peers, such as 300, or unset it for the default \
             of {} s",
            DEFAULT_TIMEOUT.as_secs()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn err(pairs: &[(&str, &str)]) -> String {
        LaunchEnv::from_vars(&vars(pairs)).unwrap_err().to_string()
    }

    #[test]
    fn no_launcher_is_one_process() {
        let env = LaunchEnv::from_vars(&vars(&[("PATH", "/bin")])).unwrap();
        assert_eq!(env, LaunchEnv::single());
        assert!(!env.is_distributed());
    }

    #[test]
    fn torchrun_variables() {
        let env = LaunchEnv::from_vars(&vars(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "node7"),
            ("MASTER_PORT", "29500"),
        ]))
        .unwrap();
        assert_eq!(
            (env.rank, env.world_size, env.local_rank, env.launcher),
            (3, 8, 1, Launcher::Torchrun)
        );
        assert_eq!(env.master_addr.as_deref(), Some("node7"));
        assert_eq!(env.master_port, Some(29500));
        assert!(env.is_distributed());
    }

    #[test]
    fn hand_set_rank_without_local_rank_is_one_host() {
        let env = LaunchEnv::from_vars(&vars(&[("RANK", "1"), ("WORLD_SIZE", "2")])).unwrap();
        assert_eq!((env.rank, env.local_rank), (1, 1));
    }

    #[test]
    fn each_mpi_launcher_and_slurm() {
        let ompi = LaunchEnv::from_vars(&vars(&[
            ("OMPI_COMM_WORLD_RANK", "5"),
            ("OMPI_COMM_WORLD_SIZE", "6"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
        ]))
        .unwrap();
        assert_eq!(
            (ompi.rank, ompi.world_size, ompi.local_rank, ompi.launcher),
            (5, 6, 2, Launcher::OpenMpi)
        );
        assert!(ompi.launcher.is_mpi());
        let pmi = LaunchEnv::from_vars(&vars(&[
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "4"),
            ("MPI_LOCALRANKID", "0"),
        ]))
        .unwrap();
        assert_eq!(
            (pmi.rank, pmi.world_size, pmi.local_rank, pmi.launcher),
            (1, 4, 0, Launcher::Pmi)
        );
        let slurm = LaunchEnv::from_vars(&vars(&[
            ("SLURM_PROCID", "7"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_LOCALID", "3"),
        ]))
        .unwrap();
        assert_eq!(
            (
                slurm.rank,
                slurm.world_size,
                slurm.local_rank,
                slurm.launcher
            ),
            (7, 16, 3, Launcher::Slurm)
        );
        assert!(!slurm.launcher.is_mpi());
    }

    #[test]
    fn mpirun_inside_a_slurm_allocation_uses_the_mpi_ranks() {
        let env = LaunchEnv::from_vars(&vars(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ]))
        .unwrap();
        assert_eq!(
            (env.rank, env.world_size, env.launcher),
            (3, 4, Launcher::OpenMpi)
        );
    }

    #[test]
    fn agreeing_launchers_are_accepted() {
        let env = LaunchEnv::from_vars(&vars(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
        ]))
        .unwrap();
        assert_eq!(
            (env.rank, env.local_rank, env.launcher),
            (1, 0, Launcher::OpenMpi)
        );
    }

    #[test]
    fn disagreeing_launchers_name_both_variables() {
        let msg = err(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
        ]);
        assert!(
            msg.contains("RANK=0") && msg.contains("OMPI_COMM_WORLD_RANK=1"),
            "{msg}"
        );
        assert!(msg.contains("unset RANK and WORLD_SIZE"), "{msg}");
        let msg = err(&[
            ("PMI_RANK", "0"),
            ("PMI_SIZE", "3"),
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
        ]);
        assert!(
            msg.contains("PMI_SIZE=3") && msg.contains("OMPI_COMM_WORLD_SIZE=2"),
            "{msg}"
        );
    }

    #[test]
    fn malformed_values_name_the_variable_and_the_fix() {
        let msg = err(&[("RANK", "one"), ("WORLD_SIZE", "2")]);
        assert!(msg.contains("RANK=\"one\" is not a whole number"), "{msg}");
        let msg = err(&[("RANK", "-1"), ("WORLD_SIZE", "2")]);
        assert!(msg.contains("RANK=\"-1\""), "{msg}");
        let msg = err(&[("RANK", "2"), ("WORLD_SIZE", "2")]);
        assert!(msg.contains("RANK=2 is not below WORLD_SIZE=2"), "{msg}");
        assert!(msg.contains("from 0 to 1"), "{msg}");
        let msg = err(&[("RANK", "0"), ("WORLD_SIZE", "0")]);
        assert!(msg.contains("WORLD_SIZE=0"), "{msg}");
        let msg = err(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "5"),
        ]);
        assert!(
            msg.contains("SLURM_LOCALID=5 is not below SLURM_NTASKS=2"),
            "{msg}"
        );
        let msg = err(&[("RANK", "1")]);
        assert!(msg.contains("WORLD_SIZE is unset"), "{msg}");
        let msg = err(&[("LOCAL_RANK", "0")]);
        assert!(msg.contains("RANK is unset"), "{msg}");
        let msg = err(&[("MASTER_PORT", "http")]);
        assert!(
            msg.contains("MASTER_PORT=\"http\" is not a port number"),
            "{msg}"
        );
        let msg = err(&[("MASTER_PORT", "70000")]);
        assert!(msg.contains("MASTER_PORT=\"70000\""), "{msg}");
        assert!(matches!(
            LaunchEnv::from_vars(&vars(&[("RANK", "x"), ("WORLD_SIZE", "1")])),
            Err(Error::Environment(_))
        ));
    }

    #[test]
    fn timeout_parsing() {
        assert_eq!(timeout_from_vars(&vars(&[])).unwrap(), DEFAULT_TIMEOUT);
        assert_eq!(
            timeout_from_vars(&vars(&[(TIMEOUT_VAR, "2.5")])).unwrap(),
            Duration::from_millis(2500)
        );
        assert_eq!(
            timeout_from_vars(&vars(&[(TIMEOUT_VAR, "0.001")])).unwrap(),
            Duration::from_millis(1)
        );
        // 1e-300 seconds was accepted as a zero timeout (found by fuzz_hostile).
        for bad in ["0", "-3", "soon", "inf", "NaN", "1e-300", "0.0009"] {
            let msg = timeout_from_vars(&vars(&[(TIMEOUT_VAR, bad)]))
                .unwrap_err()
                .to_string();
            assert!(
                msg.contains("KILN_DIST_TIMEOUT") && msg.contains(bad),
                "{msg}"
            );
        }
    }
}
