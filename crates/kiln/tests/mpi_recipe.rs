//! The recipe under a real `mpirun` (issue 19's CPU verification): each test launches this test
//! binary under `mpirun -np N` with one scenario, and the ranks run [`mpi_recipe_rank_entry`],
//! which joins the MPI process group from the launcher's environment (as `train --distributed`
//! does) and trains the recipe.
//!
//! The equality: two ranks of batch 8 with SyncBatchNorm (`sync_bn`) against one process
//! (`mpirun -np 1`, a world of one) of batch 16. The `DistributedSampler` gives rank `r` the
//! positions `r, r + 2, ..` of the epoch's order, so the two ranks' batch `k` together hold
//! exactly the samples of the single process's batch `k` (augmentation is keyed by the sample's
//! index, so each sample is augmented alike); DDP averages the two halves' gradients and
//! SyncBatchNorm normalises with the statistics of both halves, which is the mean gradient over
//! the whole batch. What differs is only the order of the f32 sums (per rank, then across
//! ranks), so the parameters agree to a tolerance, not bit for bit.
//!
//! Needs Open MPI (`mpirun` on the PATH) and a build with kiln's `mpi` feature (`.ci/run`'s
//! `mpi` step). As root, `OMPI_ALLOW_RUN_AS_ROOT` is set for the ranks.
#![cfg(feature = "mpi")]

mod common;

use common::{assert_ranks_match_one_process, bits, digest, tiny_config};
use kiln::autograd::Device;
use kiln::recipe::{self, Distributed, Observer, Quiet, TrainConfig};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const SCENARIO: &str = "KILN_TEST_MPI_RECIPE_SCENARIO";
const RUN_DIR: &str = "KILN_TEST_MPI_RECIPE_RUN_DIR";
const BATCH: &str = "KILN_TEST_MPI_RECIPE_BATCH";
/// Launches so far, numbering their Open MPI session folders.
static SESSIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Runs `scenario` on `np` ranks under mpirun, training into `run_dir` with `batch` per rank;
/// returns (success, combined output, seconds).
fn launch(
    np: usize,
    scenario: &str,
    run_dir: &Path,
    batch: usize,
    timeout_s: &str,
) -> (bool, String, f64) {
    let exe = std::env::current_exe().unwrap();
    // Each launch gets its own Open MPI session folder: tests run in parallel, and two mpiruns
    // creating the shared default (`$TMPDIR/ompi.<host>.<uid>`) at once can fail with "File
    // exists" (seen in CI).
    let session = std::env::temp_dir().join(format!(
        "kiln-ompi-{}-{scenario}-{}",
        std::process::id(),
        SESSIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&session).unwrap();
    let started = Instant::now();
    let out = Command::new("mpirun")
        .args(["-np", &np.to_string(), "--oversubscribe"])
        .arg(exe)
        .args([
            "--ignored",
            "--exact",
            "mpi_recipe_rank_entry",
            "--nocapture",
        ])
        .env(SCENARIO, scenario)
        .env(RUN_DIR, run_dir)
        .env(BATCH, batch.to_string())
        .env("KILN_DIST_TIMEOUT", timeout_s)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_orte_tmpdir_base", &session)
        .env("PRTE_MCA_prte_tmpdir_base", &session)
        .output()
        .expect("mpirun must be installed to test the mpi feature (apt-get install openmpi-bin)");
    let _ = std::fs::remove_dir_all(&session);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text, started.elapsed().as_secs_f64())
}

/// The recipe at test size, per rank: 64 training images, `batch` per rank (4 batches per
/// epoch for both runs of the equality), two epochs (the first with the backbone frozen),
/// BatchNorm over every rank, no prefetch thread.
fn config(run_dir: PathBuf, batch: usize) -> TrainConfig {
    TrainConfig {
        epochs: 2,
        freeze_epochs: 1,
        batch_size: Some(batch),
        sync_bn: true,
        prefetch_batches: 0,
        ..tiny_config(run_dir, 3, (64, 16))
    }
}

fn temp_root(name: &str) -> PathBuf {
    let root = std::env::temp_dir().join(format!("kiln-mpi-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    root
}

#[test]
fn two_ranks_under_mpirun_train_as_one_process_over_the_concatenated_batches() {
    let root = temp_root("equal");
    let (ok, log, _) = launch(2, "train", &root.join("two"), 8, "60");
    assert!(ok, "{log}");
    // Both ranks end with the same state, bit for bit (rank 1 prints its digest too).
    let digests: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split_once("state digest ").map(|(_, d)| d.trim()))
        .collect();
    assert_eq!(digests.len(), 2, "{log}");
    assert_eq!(digests[0], digests[1], "{log}");
    let (ok, log, _) = launch(1, "train", &root.join("one"), 16, "60");
    assert!(ok, "{log}");
    // The order of the f32 sums differs (two halves then an all-reduce, against one batch;
    // E[x^2] - E[x]^2 against the fused kernel's statistics), a few ulps per step that AdamW
    // carries through the 8 steps; the helper's tolerance is set well above what was measured.
    assert_ranks_match_one_process(&root, "two ranks against one process", 3);
    std::fs::remove_dir_all(&root).unwrap();
}

/// A rank killed mid-epoch (SIGKILL: no error of its own) stops the job: mpirun notices it,
/// stops the other rank and names the dead one, well within the collective timeout.
#[test]
fn a_killed_rank_stops_the_recipe_on_the_other_naming_it() {
    let root = temp_root("kill");
    let (ok, log, seconds) = launch(2, "kill", &root.join("run"), 8, "30");
    assert!(!ok, "{log}");
    assert!(log.contains("process rank 1"), "{log}");
    assert!(log.contains("signal 9") || log.contains("Killed"), "{log}");
    assert!(!log.contains("state digest"), "{log}");
    assert!(seconds < 30.0, "took {seconds} s: {log}");
    let _ = std::fs::remove_dir_all(&root);
}

/// A rank that hangs mid-epoch makes the other fail within KILN_DIST_TIMEOUT with the
/// collective's error naming it, and exit non-zero, which ends the job.
#[test]
fn a_hung_rank_makes_the_recipe_on_the_other_fail_within_the_timeout() {
    let root = temp_root("hang");
    let (ok, log, seconds) = launch(2, "hang", &root.join("run"), 8, "3");
    assert!(!ok, "{log}");
    assert!(log.contains("rank 0: train failed: rank 0 of 2:"), "{log}");
    assert!(log.contains("did not finish within 3 s"), "{log}");
    assert!(seconds < 40.0, "took {seconds} s: {log}");
    let _ = std::fs::remove_dir_all(&root);
}

/// Stops rank 1 at its third batch: by SIGKILL, or by sleeping past every timeout.
struct StopAt {
    rank: usize,
    kill: bool,
    batches: usize,
}

impl Observer for StopAt {
    fn batch(&mut self, _samples: usize, _loss: f64) {
        self.batches += 1;
        if self.rank != 1 || self.batches != 3 {
            return;
        }
        if self.kill {
            let pid = std::process::id().to_string();
            let _ = Command::new("kill").args(["-9", &pid]).status();
        }
        std::thread::sleep(Duration::from_secs(120));
    }
}

/// The ranks' side of the tests above (launched by them under mpirun; ignored otherwise).
#[test]
#[ignore = "the entry point of the ranks that the other tests launch under mpirun"]
fn mpi_recipe_rank_entry() {
    let scenario = std::env::var(SCENARIO).expect("launched by the tests of this file");
    let run_dir = PathBuf::from(std::env::var(RUN_DIR).unwrap());
    let batch: usize = std::env::var(BATCH).unwrap().parse().unwrap();
    let group = kiln::distributed::init_process_group(Device::Cpu).unwrap();
    let rank = group.rank();
    let config = TrainConfig {
        distributed: Some(Distributed(group)),
        ..config(run_dir, batch)
    };
    let result = match scenario.as_str() {
        "train" => recipe::train(&config, &mut Quiet),
        "kill" | "hang" => recipe::train(
            &config,
            &mut StopAt {
                rank,
                kill: scenario == "kill",
                batches: 0,
            },
        ),
        other => panic!("unknown scenario {other}"),
    };
    match result {
        Ok(outcome) => {
            let digest = digest(&bits(&outcome.model));
            println!("rank {rank}: trained, state digest {digest:016x}");
        }
        Err(e) => {
            // What `train --distributed` does: exit non-zero, so mpirun stops the job.
            println!("rank {rank}: train failed: {e}");
            std::process::exit(1);
        }
    }
}
