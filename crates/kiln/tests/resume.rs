//! `--resume` continues bit for bit: two epochs in one go, and one epoch, a stop, a resume
//! from the checkpoint and the second epoch, end with the same parameters and buffers (bit for
//! bit) and the same logged losses; a resume with other settings than the checkpoint's is
//! refused naming them, and killed writes' temporary files, CSV rows and TensorBoard events are cleaned up (the events
//! purged as TensorBoard does). The config is tiny (100 synthetic images, width 4) but runs
//! every part of the recipe: frozen first epoch, two lr groups, accumulation over 4 batches
//! with a short last group, clipping, warm-up + cosine, prefetching loader with augmentation.
//!
//! One test per file: the recipe seeds kiln's process-wide generator, so two runs must not
//! overlap in one process.

mod common;

use common::{assert_same_bits, bits};
use kiln::data::{DataSource, NormalizeChoice};
use kiln::recipe::{take_checkpoint_settings, train, GivenSettings, Quiet, TrainConfig};
use kiln::sched::log::tfevents::{read_log_dir, EventBody};
use kiln::sched::log::ScalarLogger;

fn config(run_dir: std::path::PathBuf) -> TrainConfig {
    TrainConfig {
        epochs: 2,
        batch_size: Some(16),
        lr: 1e-2,
        run_dir,
        data: DataSource::Synthetic {
            train_len: 100,
            val_len: 20,
        },
        freeze_epochs: 1,
        accum_steps: 4,
        max_grad_norm: 0.5,
        width: 4,
        prefetch_batches: 1,
        seed: 7,
        ..TrainConfig::default()
    }
}

#[test]
fn resume_continues_bit_identically() {
    let root = std::env::temp_dir().join(format!("kiln-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);

    let straight = train(&config(root.join("straight")), &mut Quiet).unwrap();
    assert_eq!(straight.history.len(), 2);
    // 100 / 16 = 6 batches per epoch (drop_last), 12 in all.
    assert_eq!(straight.batch_losses.len(), 12);

    let first = train(
        &TrainConfig {
            stop_after: Some(1),
            ..config(root.join("resumed"))
        },
        &mut Quiet,
    )
    .unwrap();
    assert_eq!(first.history.len(), 1);
    assert_eq!(first.batch_losses[..], straight.batch_losses[..6]);
    drop(first);
    // A killed write's temporary file and a killed epoch's flushed CSV rows (a step after the
    // checkpoint's) are cleaned up by the resume below.
    let stale = root.join("resumed/.ckpt.safetensors.tmp-999999999");
    std::fs::write(&stale, b"half a checkpoint").unwrap();
    let csv_path = root.join("resumed/metrics.csv");
    let mut csv = std::fs::read_to_string(&csv_path).unwrap();
    csv.push_str("0,999,val/accuracy,0.5\n");
    std::fs::write(&csv_path, csv).unwrap();
    // ... and so are its TensorBoard events: a later file with a step after the checkpoint's,
    // which TensorBoard must not show beside the resumed run's own.
    let tb_dir = root.join("resumed/tensorboard");
    let mut orphan = ScalarLogger::in_memory().tensorboard(&tb_dir).unwrap();
    orphan.log("val/accuracy", 999, 0.5).unwrap();
    orphan.log("train/loss", 3, 99.0).unwrap();
    drop(orphan);
    // Settings that differ from the checkpoint's are refused, naming the flag to pass.
    let refused = [
        (
            TrainConfig {
                width: 8,
                ..config(root.join("resumed"))
            },
            "--width 8 (checkpoint: 4)",
        ),
        (
            TrainConfig {
                seed: 8,
                ..config(root.join("resumed"))
            },
            "--seed 8 (checkpoint: 7)",
        ),
        (
            TrainConfig {
                normalize: "imagenet".parse().unwrap(),
                ..config(root.join("resumed"))
            },
            "pass the --normalize the run started with",
        ),
        (
            TrainConfig {
                lr: 2e-2,
                ..config(root.join("resumed"))
            },
            "--lr 0.02 (checkpoint: 0.01); to continue it pass --lr 0.01 or leave the flag out",
        ),
        (
            TrainConfig {
                batch_size: Some(8),
                ..config(root.join("resumed"))
            },
            "--batch-size 8 (checkpoint: 16)",
        ),
    ];
    for (bad, want) in refused {
        let msg = train(
            &TrainConfig {
                resume: true,
                ..bad
            },
            &mut Quiet,
        )
        .err()
        .unwrap()
        .to_string();
        assert!(msg.contains(want) && msg.len() < 400, "{msg}");
    }
    // Asking to resume where there is no checkpoint says so.
    struct Missing(Option<std::path::PathBuf>);
    impl kiln::recipe::Observer for Missing {
        fn setup(&mut self, setup: &kiln::recipe::Setup) {
            self.0 = setup.resume_missing.clone();
        }
    }
    let mut missing = Missing(None);
    let fresh = TrainConfig {
        resume: true,
        stop_after: Some(0),
        ..config(root.join("fresh"))
    };
    let mut untouched = fresh.clone();
    assert!(!take_checkpoint_settings(&mut untouched, GivenSettings::default()).unwrap());
    assert_eq!((untouched.lr, untouched.seed), (fresh.lr, fresh.seed));
    train(&fresh, &mut missing).unwrap();
    assert_eq!(missing.0, Some(root.join("fresh/ckpt.safetensors")));
    // A resume given none of the compared flags (the CLI's defaults: another lr, seed and width
    // than the run's) takes the checkpoint's: lr 0.01, seed 7, width 4. An explicit flag is kept
    // (and then refused above when it differs).
    let mut resumed = TrainConfig {
        resume: true,
        lr: TrainConfig::default().lr,
        seed: TrainConfig::default().seed + 1,
        width: TrainConfig::default().width,
        ..config(root.join("resumed"))
    };
    let given_lr = GivenSettings {
        lr: true,
        ..GivenSettings::default()
    };
    let mut explicit = TrainConfig {
        lr: 2e-2,
        ..resumed.clone()
    };
    assert!(take_checkpoint_settings(&mut explicit, given_lr).unwrap());
    assert_eq!((explicit.lr, explicit.seed, explicit.width), (2e-2, 7, 4));
    assert!(take_checkpoint_settings(&mut resumed, GivenSettings::default()).unwrap());
    assert_eq!((resumed.lr, resumed.seed, resumed.width), (1e-2, 7, 4));
    // the synthetic set's own statistics, as the checkpoint recorded them
    let info = kiln::recipe::checkpoint::read_info(&root.join("resumed/ckpt.safetensors")).unwrap();
    assert_eq!(
        resumed.normalize,
        NormalizeChoice::Constants(info.normalize)
    );
    let second = train(&resumed, &mut Quiet).unwrap();
    assert_eq!(second.batch_losses[..], straight.batch_losses[6..]);

    // Same history (losses, accuracy, lrs, gradient norms) apart from wall time and memory.
    assert_eq!(second.history.len(), 2);
    for (a, b) in straight.history.iter().zip(&second.history) {
        assert_eq!(
            (
                a.frozen,
                a.train_loss,
                a.val_loss,
                a.val_accuracy,
                a.lr,
                a.grad_norm
            ),
            (
                b.frozen,
                b.train_loss,
                b.val_loss,
                b.val_accuracy,
                b.lr,
                b.grad_norm
            )
        );
    }
    assert!(straight.history[0].frozen && !straight.history[1].frozen);
    assert_same_bits(&bits(&straight.model), &bits(&second.model));
    // The resumed run appended to the first part's CSV: one validation row per epoch.
    let csv = std::fs::read_to_string(root.join("resumed/metrics.csv")).unwrap();
    assert_eq!(
        csv.lines().filter(|l| l.contains(",val/accuracy,")).count(),
        2
    );
    assert!(root.join("resumed/metrics.svg").exists());
    assert!(!csv.contains(",999,") && !stale.exists());
    // TensorBoard (and kiln's reader of a log folder, which applies its purge rule) shows each
    // optimizer step once: 2 per epoch (6 batches in groups of 4), the resumed run's from step 3.
    let mut loss_steps = Vec::new();
    let mut val_steps = Vec::new();
    for event in read_log_dir(&tb_dir).unwrap() {
        let EventBody::Scalars(values) = &event.body else {
            continue;
        };
        for (tag, value) in values {
            match tag.as_str() {
                "train/loss" => {
                    assert_ne!(*value, 99.0, "the orphaned step 3 is shown");
                    loss_steps.push(event.step);
                }
                "val/accuracy" => val_steps.push(event.step),
                _ => {}
            }
        }
    }
    assert_eq!(loss_steps, [1, 2, 3, 4]);
    assert_eq!(val_steps, [2, 4]);
    let _ = std::fs::remove_dir_all(&root);
}
