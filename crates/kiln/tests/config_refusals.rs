//! The recipe refuses settings that cannot work before it builds anything, naming the setting
//! (a non-finite learning rate, a warm-up share outside [0, 1)), and a run of a single
//! optimizer step trains (its warm-up takes the one step; the cosine after it never starts).

mod common;

use common::tiny_config;
use kiln::recipe::{train, Quiet, TrainConfig};

#[test]
fn unworkable_settings_are_refused_by_name_and_a_one_step_run_trains() {
    let root = std::env::temp_dir().join(format!("kiln-config-refusals-{}", std::process::id()));
    let base = || tiny_config(root.join("run"), 1, (32, 16));
    let refused = [
        (
            TrainConfig {
                lr: f64::INFINITY,
                ..base()
            },
            "--lr inf: pass a finite learning rate",
        ),
        (
            TrainConfig {
                warmup_fraction: 1.0,
                ..base()
            },
            "warmup_fraction 1.0: the share of the optimizer steps",
        ),
        (
            TrainConfig {
                warmup_fraction: -0.5,
                ..base()
            },
            "warmup_fraction -0.5:",
        ),
        (
            TrainConfig {
                warmup_fraction: f64::NAN,
                ..base()
            },
            "warmup_fraction NaN:",
        ),
        // Hostile values are echoed as 1e300, not as 301 digits.
        (
            TrainConfig {
                warmup_fraction: 1e300,
                ..base()
            },
            "warmup_fraction 1e300:",
        ),
        (
            TrainConfig {
                backbone_lr_factor: -1e300,
                ..base()
            },
            "--backbone-lr-factor -1e300:",
        ),
    ];
    for (config, want) in refused {
        let err = train(&config, &mut Quiet).unwrap_err().to_string();
        assert!(err.contains(want), "`{want}` missing from: {err}");
    }
    // Sixteen images in one batch, one epoch, nothing frozen: one optimizer step in all.
    let one = TrainConfig {
        epochs: 1,
        freeze_epochs: 0,
        ..tiny_config(root.join("one"), 1, (16, 16))
    };
    let outcome = train(&one, &mut Quiet).unwrap();
    assert_eq!(outcome.batch_losses.len(), 1);
    assert!(outcome.batch_losses[0].is_finite());
    let _ = std::fs::remove_dir_all(&root);
}
