//! The fuzz suite for the README's main command: `train` with hostile settings, each field of
//! [`TrainConfig`] (what the `train` example's flags set) either the test-size recipe's value
//! or a hostile one (0, the top of its type, NaN and infinities, a dtype autocast cannot use, a
//! batch larger than the data, a depth or width no memory holds, ...), on a small synthetic
//! set. Every run must end in `Ok` or a typed error within the harness's time limit: no panic,
//! no abort (the test caps its address space, as a `ulimit -v` would), no hang. A run the
//! settings make valid trains one epoch at most (`stop_after`), so valid settings stay quick.
//!
//! Its own test binary, one test: the recipe seeds kiln's process-wide generator, so its runs
//! must not overlap another test's in one process.

mod common;
#[allow(dead_code)]
#[path = "fuzz_hostile/harness.rs"]
mod harness;

use harness::{run, Outcome, Rng};
use kiln::autograd::DType;
use kiln::data::DataSource;
use kiln::optim::GradScalerOptions;
use kiln::recipe::{train, Arch, Quiet, TrainConfig};
use std::path::Path;

/// `base` most of the time (a case changes one or two of its many fields), else one of
/// `hostile`.
fn or_hostile<T: Clone>(rng: &mut Rng, base: T, hostile: &[T]) -> T {
    match rng.chance(0.93) {
        true => base,
        false => rng.pick(hostile),
    }
}

fn hostile_config(rng: &mut Rng, run_dir: &Path) -> TrainConfig {
    let huge = 1usize << 40;
    let floats = [0.0, -1.0, f64::NAN, f64::INFINITY, 1e300, -1e300, 1e-300];
    let mut c = common::tiny_config(run_dir.to_path_buf(), 7, (32, 16));
    c.blocks = [1, 1, 1, 1];
    c.epochs = or_hostile(rng, 2, &[0, 1, 3, usize::MAX]);
    // Never `None` or more than 1: a valid run must stay one epoch long.
    c.stop_after = or_hostile(rng, Some(1), &[Some(0)]);
    c.batch_size = or_hostile(
        rng,
        Some(16),
        &[
            None,
            Some(0),
            Some(1),
            Some(33),
            Some(huge),
            Some(usize::MAX),
        ],
    );
    c.max_auto_batch = or_hostile(rng, 64, &[0, 1, usize::MAX]);
    c.lr = or_hostile(rng, 1e-2, &floats);
    c.backbone_lr_factor = or_hostile(rng, 0.1, &floats);
    c.weight_decay = or_hostile(rng, 0.05, &floats);
    c.warmup_fraction = or_hostile(rng, 0.1, &[-0.1, 0.0, 0.999_999, 1.0, 1e300, f64::NAN]);
    c.seed = or_hostile(rng, 7, &[0, u64::MAX]);
    c.freeze_epochs = or_hostile(rng, 1, &[0, 2, usize::MAX]);
    c.accum_steps = or_hostile(rng, 1, &[0, 2, 3, 1000, usize::MAX]);
    c.max_grad_norm = or_hostile(rng, 1.0, &floats);
    (c.amp, c.amp_dtype) = or_hostile(
        rng,
        (false, DType::F32),
        &[
            (true, DType::F16),
            (true, DType::BF16),
            (true, DType::F32),
            (true, DType::I64),
        ],
    );
    c.grad_scaler = GradScalerOptions {
        init_scale: or_hostile(rng, 65536.0, &floats),
        growth_factor: or_hostile(rng, 2.0, &[1.0, 0.5, f64::NAN, f64::INFINITY]),
        backoff_factor: or_hostile(rng, 0.5, &[0.0, 1.0, 2.0, f64::NAN]),
        growth_interval: or_hostile(rng, 2000, &[0, 1, u64::MAX]),
        ..GradScalerOptions::default()
    };
    c.model = or_hostile(
        rng,
        Arch::CifarResNet,
        &[Arch::ResNet18, Arch::ResNet34, Arch::ResNet50],
    );
    c.width = or_hostile(rng, 4, &[0, 1, 3, huge, usize::MAX]);
    c.blocks = or_hostile(
        rng,
        [1, 1, 1, 1],
        &[
            [0, 1, 1, 1],
            [1, 1, 1, usize::MAX],
            [huge, 1, 1, 1],
            [2, 2, 2, 2],
        ],
    );
    c.augment = rng.chance(0.5);
    c.prefetch_batches = or_hostile(rng, 1, &[0, huge, usize::MAX]);
    c.memory_history = or_hostile(rng, None, &[Some(0), Some(1), Some(usize::MAX)]);
    let (train_len, val_len) = or_hostile(
        rng,
        (32, 16),
        &[
            (0, 16),
            (1, 1),
            (5, 0),
            (32, huge),
            (huge, 16),
            (usize::MAX, 16),
        ],
    );
    c.data = DataSource::Synthetic { train_len, val_len };
    c.sync_bn = rng.chance(0.05);
    c.resume = rng.chance(0.1);
    c
}

#[test]
fn fuzz_train_settings() {
    kiln_testkit::limit_address_space(kiln_testkit::FUZZ_ADDRESS_SPACE_BYTES);
    let root = std::env::temp_dir().join(format!("kiln-fuzz-train-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let run_dir = root.join("run");
    // Finds of a longer hunt, checked on every run: a depth no memory holds (built block by
    // block for hours before) and epochs whose step count overflows (a debug-build panic).
    let base = common::tiny_config(run_dir.clone(), 7, (32, 16));
    let deep = TrainConfig {
        blocks: [1 << 40, 1, 1, 1],
        ..base.clone()
    };
    let msg = train(&deep, &mut Quiet).unwrap_err().to_string();
    assert!(msg.contains("more than this machine's memory"), "{msg}");
    let endless = TrainConfig {
        epochs: usize::MAX,
        stop_after: Some(1),
        ..base
    };
    let msg = train(&endless, &mut Quiet).unwrap_err().to_string();
    assert!(msg.contains("pass fewer --epochs"), "{msg}");
    run(
        "train settings",
        0x5eed_0201,
        150,
        |rng| hostile_config(rng, &run_dir),
        |config| {
            let _ = std::fs::remove_dir_all(&run_dir);
            Outcome::from(train(config, &mut Quiet))
        },
    );
    let _ = std::fs::remove_dir_all(&root);
}
