//! The recipe on `--device cuda` over NCCL (issue 19's GPU check without GPUs): two processes,
//! rank `r` on `cuda:r`, started with torchrun's variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `MASTER_ADDR`, `MASTER_PORT`), train the recipe with `sync_bn`, batch 8 each, and end where
//! one process (a world of one on `cuda:0`) of batch 16 ends, as tests/mpi_recipe.rs checks on
//! the CPU under mpirun (the same sharding argument; the tolerance covers the order of the sums).
//!
//! Skips without two CUDA devices (fails instead under `KILN_REQUIRE_CUDA=1`); CI runs it under
//! the CUDA emulator, whose NCCL works across processes (`cargo xtask emu-suite`).
#![cfg(feature = "cuda")]

mod common;

use common::{assert_ranks_match_one_process, bits, digest, tiny_config};
use kiln::device::testing::cuda_device_or_skip;
use kiln::device::Device;
use kiln::recipe::{self, Distributed, Quiet, TrainConfig};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const RUN_DIR: &str = "KILN_TEST_NCCL_RECIPE_RUN_DIR";
const BATCH: &str = "KILN_TEST_NCCL_RECIPE_BATCH";

/// True when two CUDA devices can take the two ranks: always under the emulator (each rank's
/// process emulates two), else when this machine has two.
fn two_devices() -> bool {
    if cuda_device_or_skip().is_none() {
        return false;
    }
    let emulated = std::env::var("KILN_EMULATED").is_ok_and(|v| v == "1");
    if !emulated && Device::cuda_device_count() < 2 {
        eprintln!("skipping: the two-rank NCCL recipe test needs two CUDA devices");
        return false;
    }
    true
}

/// Runs [`nccl_recipe_rank_entry`] as `world` processes training into `run_dir` with `batch`
/// per rank; returns each rank's (success, output).
fn launch(world: usize, run_dir: &Path, batch: usize) -> Vec<(bool, String)> {
    let exe = std::env::current_exe().unwrap();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let children: Vec<_> = (0..world)
        .map(|rank| {
            Command::new(&exe)
                .args([
                    "--ignored",
                    "--exact",
                    "nccl_recipe_rank_entry",
                    "--nocapture",
                ])
                .env(RUN_DIR, run_dir)
                .env(BATCH, batch.to_string())
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env("KILN_DIST_TIMEOUT", "120")
                .env("KILN_EMU_DEVICES", "2")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            (out.status.success(), text)
        })
        .collect()
}

/// tests/mpi_recipe.rs's run on CUDA with half the images (32: two batches per epoch and rank,
/// so the emulator trains it in seconds), two epochs (the first frozen), SyncBatchNorm.
fn config(run_dir: PathBuf, batch: usize, device: Device) -> TrainConfig {
    TrainConfig {
        epochs: 2,
        freeze_epochs: 1,
        batch_size: Some(batch),
        sync_bn: true,
        prefetch_batches: 0,
        device,
        ..tiny_config(run_dir, 3, (32, 16))
    }
}

#[test]
fn two_cuda_ranks_over_nccl_train_as_one_process_over_the_concatenated_batches() {
    if !two_devices() {
        return;
    }
    let root = std::env::temp_dir().join(format!("kiln-nccl-recipe-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let ranks = launch(2, &root.join("two"), 8);
    let mut digests = Vec::new();
    for (r, (ok, log)) in ranks.iter().enumerate() {
        assert!(ok, "rank {r}: {log}");
        let d = log
            .lines()
            .find_map(|l| l.split_once("state digest ").map(|(_, d)| d.trim()));
        digests.push(d.unwrap_or_else(|| panic!("rank {r}: {log}")).to_string());
    }
    assert_eq!(digests[0], digests[1], "the two ranks ended apart");
    let one = launch(1, &root.join("one"), 16);
    assert!(one[0].0, "{}", one[0].1);
    assert_ranks_match_one_process(&root, "two CUDA ranks against one process", 3);
    std::fs::remove_dir_all(&root).unwrap();
}

/// One rank of the test above (launched by it; ignored otherwise).
#[test]
#[ignore = "the entry point of the ranks that the test of this file launches"]
fn nccl_recipe_rank_entry() {
    let run_dir = PathBuf::from(std::env::var(RUN_DIR).expect("launched by the test"));
    let batch: usize = std::env::var(BATCH).unwrap().parse().unwrap();
    let local: usize = std::env::var("LOCAL_RANK").unwrap().parse().unwrap();
    let device = Device::Cuda(local);
    let group = kiln::distributed::init_process_group(device).unwrap();
    let rank = group.rank();
    let config = TrainConfig {
        distributed: Some(Distributed(group)),
        ..config(run_dir, batch, device)
    };
    let outcome = recipe::train(&config, &mut Quiet).unwrap();
    println!(
        "rank {rank}: trained, state digest {:016x}",
        digest(&bits(&outcome.model))
    );
}
