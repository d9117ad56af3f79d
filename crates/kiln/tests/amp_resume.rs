//! An f16 `--amp` run resumes bit for bit: the `GradScaler`'s scale and growth tracker are in
//! the checkpoint, so one epoch, a stop, a resume and the second epoch end with the same
//! scaler state, losses and parameters as two epochs in one go. A growth interval of 2 makes
//! the scale move within the first epoch, so a resume that restarted the scale would differ.
//!
//! One test per file: the recipe seeds kiln's process-wide generator, so two runs must not
//! overlap in one process.

mod common;

use common::{assert_same_bits, bits, tiny_config};
use kiln::device::DType;
use kiln::optim::GradScalerOptions;
use kiln::recipe::{train, Quiet, TrainConfig};

fn config(run_dir: std::path::PathBuf) -> TrainConfig {
    TrainConfig {
        freeze_epochs: 0,
        augment: false,
        amp: true,
        amp_dtype: DType::F16,
        grad_scaler: GradScalerOptions {
            growth_interval: 2,
            ..GradScalerOptions::default()
        },
        ..tiny_config(run_dir, 11, (64, 16))
    }
}

#[test]
fn f16_amp_resume_restores_the_loss_scale() {
    let root = std::env::temp_dir().join(format!("kiln-amp-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);

    let straight = train(&config(root.join("straight")), &mut Quiet).unwrap();
    // 64 / 16 = 4 batches per epoch, 2 epochs.
    assert_eq!(straight.batch_losses.len(), 8);

    let first = train(
        &TrainConfig {
            stop_after: Some(1),
            ..config(root.join("resumed"))
        },
        &mut Quiet,
    )
    .unwrap();
    let after_one = first.grad_scaler.clone().unwrap();
    // The scale moved during the first epoch: restarting it would be visible.
    let fresh = GradScalerOptions::default();
    assert!(
        (f64::from(after_one.scale), after_one.growth_tracker) != (fresh.init_scale, 0),
        "{after_one:?}"
    );
    drop(first);
    let second = train(
        &TrainConfig {
            resume: true,
            ..config(root.join("resumed"))
        },
        &mut Quiet,
    )
    .unwrap();
    assert_eq!(second.batch_losses[..], straight.batch_losses[4..]);
    assert_eq!(second.grad_scaler, straight.grad_scaler);
    assert_same_bits(&bits(&straight.model), &bits(&second.model));
    let _ = std::fs::remove_dir_all(&root);
}
