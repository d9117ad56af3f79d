//! The recipe's data-parallel mode on two ranks that are threads of this process
//! (`ThreadGroup`: the same `DistributedDataParallel`, sampler and rank-0-only writing as under
//! `mpirun`, without MPI). What is checked: both ranks end bit-identical, each trained on its
//! own shard, the loss went down, rank 1 wrote nothing, a stopped run resumed on both ranks
//! from rank 0's checkpoint ends bit for bit where the straight run ends, a resume with another
//! number of ranks is refused, and an error on one rank stops the other with an error naming it.
//!
//! Equality with one process over the concatenated batches (with `sync_bn`: per-rank BatchNorm
//! statistics would differ from one process's over 2B) is checked under a real `mpirun` in
//! tests/mpi_recipe.rs.

mod common;

use common::{assert_same_bits, bits, tiny_config};
use kiln::autograd::Module;
use kiln::distributed::zero::{partition, Zero1Saving};
use kiln::distributed::{ProcessGroup, ThreadGroup};
use kiln::recipe::{self, Distributed, Observer, Outcome, Quiet, Setup, TrainConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The per-rank settings: 64 training images, batch 8 per rank (so 4 batches per rank and
/// epoch), accumulation over 2 batches (one `no_sync` batch per step), one frozen epoch, no
/// augmentation, no prefetch thread.
fn config(run_dir: PathBuf) -> TrainConfig {
    TrainConfig {
        epochs: 3,
        batch_size: Some(8),
        accum_steps: 2,
        freeze_epochs: 1,
        augment: false,
        prefetch_batches: 0,
        ..tiny_config(run_dir, 3, (64, 16))
    }
}

/// Runs `configs[r]` as rank `r` of a group of threads; returns each rank's result.
fn run_ranks(configs: Vec<TrainConfig>) -> Vec<recipe::Result<Outcome>> {
    let groups = ThreadGroup::with_timeout(configs.len(), Duration::from_secs(60)).unwrap();
    let handles: Vec<_> = configs
        .into_iter()
        .zip(groups)
        .map(|(config, group)| {
            let group: Arc<dyn ProcessGroup> = Arc::new(group);
            let config = TrainConfig {
                distributed: Some(Distributed(group)),
                ..config
            };
            std::thread::spawn(move || recipe::train(&config, &mut Quiet))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn temp_root(name: &str) -> PathBuf {
    let root = std::env::temp_dir().join(format!("kiln-dist-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    root
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn two_ranks_train_identical_models_on_their_own_shards_and_only_rank_0_writes() {
    let root = temp_root("train");
    let mut outcomes = run_ranks(vec![config(root.join("r0")), config(root.join("r1"))]);
    let one = outcomes.pop().unwrap().unwrap();
    let zero = outcomes.pop().unwrap().unwrap();
    // Gradients averaged over the ranks, every step: the parameters and BatchNorm's buffers
    // (re-broadcast from rank 0 at each synced forward) end equal bit for bit.
    assert_same_bits(&bits(&zero.model), &bits(&one.model));
    // 64 samples over 2 ranks, batch 8: 4 batches a rank, 3 epochs.
    assert_eq!(zero.batch_losses.len(), 12);
    assert_eq!(one.batch_losses.len(), 12);
    // Each rank read its own shard: the same model gives other losses on other samples.
    for (a, b) in zero.batch_losses.iter().zip(&one.batch_losses) {
        assert_ne!(
            a.to_bits(),
            b.to_bits(),
            "the ranks trained on the same batches"
        );
    }
    // The reported training loss is the mean over both ranks, the same on each, and it falls.
    for (a, b) in zero.history.iter().zip(&one.history) {
        assert_eq!(a.train_loss.to_bits(), b.train_loss.to_bits());
    }
    let first = zero.history.first().unwrap().train_loss;
    let last = zero.history.last().unwrap().train_loss;
    assert!(last < first, "training loss went from {first} to {last}");
    // Rank 0 wrote the run folder; rank 1 did not even create its own.
    assert_eq!(
        names_in(&root.join("r0")),
        [
            "ckpt.safetensors",
            "memory.svg",
            "metrics.csv",
            "metrics.svg",
            "tensorboard"
        ]
    );
    assert!(!root.join("r1").exists());
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn both_ranks_resume_from_rank_0s_checkpoint_bit_identically() {
    let root = temp_root("resume");
    let straight: Vec<Outcome> = run_ranks(vec![config(root.join("a")), config(root.join("a"))])
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let stopped = TrainConfig {
        stop_after: Some(2),
        ..config(root.join("b"))
    };
    for r in run_ranks(vec![stopped.clone(), stopped]) {
        assert_eq!(r.unwrap().history.len(), 2);
    }
    let resumed = TrainConfig {
        resume: true,
        ..config(root.join("b"))
    };
    let resumed: Vec<Outcome> = run_ranks(vec![resumed.clone(), resumed])
        .into_iter()
        .map(Result::unwrap)
        .collect();
    for r in 0..2 {
        // The resumed call trained only the last epoch, from the checkpoint's state.
        assert_eq!(resumed[r].batch_losses.len(), 4);
        assert_eq!(resumed[r].batch_losses[..], straight[r].batch_losses[8..]);
        assert_same_bits(&bits(&resumed[r].model), &bits(&straight[r].model));
    }
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_resume_with_another_number_of_ranks_is_refused_naming_both_counts() {
    let root = temp_root("world");
    let stopped = TrainConfig {
        stop_after: Some(1),
        ..config(root.join("run"))
    };
    for r in run_ranks(vec![stopped.clone(), stopped]) {
        assert_eq!(r.unwrap().history.len(), 1);
    }
    // One process (no group) resuming the two ranks' checkpoint.
    let alone = TrainConfig {
        resume: true,
        ..config(root.join("run"))
    };
    let msg = recipe::train(&alone, &mut Quiet).unwrap_err().to_string();
    assert!(
        msg.contains("was written by a run of 2 rank(s), and this run has 1"),
        "{msg}"
    );
    assert!(
        msg.contains("relaunch with 2 rank(s) (`mpirun -np 2`"),
        "{msg}"
    );
    // Three ranks: every rank refuses, with the same counts.
    let resumed = vec![alone.clone(), alone.clone(), alone];
    for r in run_ranks(resumed) {
        let msg = r.unwrap_err().to_string();
        assert!(
            msg.contains("written by a run of 2 rank(s), and this run has 3"),
            "{msg}"
        );
    }
    std::fs::remove_dir_all(&root).unwrap();
}

/// Records the memory plan's optimizer state and the ZeRO-1 figures of the setup.
#[derive(Default)]
struct PlanSeen(Option<(usize, Option<Zero1Saving>)>);

impl Observer for PlanSeen {
    fn setup(&mut self, s: &Setup) {
        self.0 = Some((s.plan.optimizer_state_bytes, s.zero1));
    }
}

#[test]
fn the_setup_of_two_ranks_shows_what_zero1_saves_in_exact_bytes() {
    let root = temp_root("zero1");
    let groups = ThreadGroup::with_timeout(2, Duration::from_secs(60)).unwrap();
    let handles: Vec<_> = groups
        .into_iter()
        .map(|g| {
            let group: Arc<dyn ProcessGroup> = Arc::new(g);
            let config = TrainConfig {
                stop_after: Some(0),
                distributed: Some(Distributed(group)),
                ..config(root.join("run"))
            };
            std::thread::spawn(move || {
                let mut seen = PlanSeen::default();
                let outcome = recipe::train(&config, &mut seen).unwrap();
                (seen.0.unwrap(), outcome)
            })
        })
        .collect();
    for h in handles {
        let ((state_bytes, zero1), outcome) = h.join().unwrap();
        let numels: Vec<usize> = outcome
            .model
            .parameters()
            .iter()
            .map(|p| p.numel())
            .collect();
        let total: usize = numels.iter().sum();
        // AdamW keeps two f32 moments per element.
        assert_eq!(state_bytes, 8 * total);
        let owner = partition(&numels, 2);
        let largest = (0..2)
            .map(|r| {
                (0..numels.len())
                    .filter(|&i| owner[i] == r)
                    .map(|i| numels[i])
                    .sum::<usize>()
            })
            .max()
            .unwrap();
        let z = zero1.expect("two ranks show the ZeRO-1 figures");
        assert_eq!(z.unsharded_state_bytes, 8 * total);
        assert_eq!(z.sharded_state_bytes, 8 * largest);
        // The width-4 CIFAR ResNet: 19,902 elements (108 + 8 stem, 304, 944, 3,680 and 14,528
        // in the stages, 330 in the head); the greedy split (largest tensor first, each to the
        // lighter rank) ends with shards of 9,952 and 9,950 elements.
        assert_eq!((total, largest), (19_902, 9_952));
        assert_eq!(z.unsharded_state_bytes, 159_216);
        assert_eq!(z.sharded_state_bytes, 79_616);
    }
    // One process shows none.
    let mut seen = PlanSeen::default();
    let alone = TrainConfig {
        stop_after: Some(0),
        ..config(root.join("alone"))
    };
    recipe::train(&alone, &mut seen).unwrap();
    assert_eq!(seen.0.unwrap().1, None);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn an_error_on_one_rank_stops_the_other_naming_it() {
    let root = temp_root("error");
    let broken = TrainConfig {
        accum_steps: 0,
        ..config(root.join("r1"))
    };
    let mut results = run_ranks(vec![config(root.join("r0")), broken]);
    let one = results.pop().unwrap().unwrap_err().to_string();
    assert!(one.contains("accum-steps must be at least 1"), "{one}");
    let zero = results.pop().unwrap().unwrap_err().to_string();
    assert!(zero.starts_with("rank 0 of 2: all_reduce"), "{zero}");
    assert!(zero.contains("rank 1 left the group"), "{zero}");
    let _ = std::fs::remove_dir_all(&root);
}
