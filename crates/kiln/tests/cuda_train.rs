//! The recipe end to end on `cuda:0` (skips without a usable device; fails instead under
//! `KILN_REQUIRE_CUDA=1`): the same tiny run on the CPU and on CUDA logs the same batch losses
//! to 1e-3 and reaches the same validation accuracy to two samples, the trained model's
//! tensors live on the device, the device's peak memory is reported, and a bf16 `--amp` run on
//! CUDA trains (finite, falling loss) with an f32 checkpoint.
//!
//! One test in this file: the recipe seeds kiln's process-wide generator, so two runs must not
//! overlap in one process.
//!
//! Under the CUDA emulator (`KILN_EMULATED=1`, set by `cargo xtask emu`) the data set is a
//! quarter as large (64 training samples, 16 validation) with the same batch size, so the three
//! runs take seconds, not minutes, on a CPU; every check still runs, over the batches there are.

use kiln::data::DataSource;
use kiln::device::testing::cuda_device_or_skip;
use kiln::device::{DType, Device};
use kiln::models::checkpoint::load_tensors;
use kiln::models::LayerExt;
use kiln::recipe::{train, Quiet, TrainConfig};

/// True under the CUDA emulator, whose kernels run on the CPU.
fn emulated() -> bool {
    std::env::var("KILN_EMULATED").is_ok_and(|v| v == "1")
}

/// Training and validation samples: (256, 64), a quarter under emulation.
fn samples() -> (usize, usize) {
    if emulated() {
        (64, 16)
    } else {
        (256, 64)
    }
}

fn config(run_dir: std::path::PathBuf, device: Device) -> TrainConfig {
    let (train_len, val_len) = samples();
    TrainConfig {
        epochs: 2,
        batch_size: Some(32),
        lr: 1e-2,
        device,
        run_dir,
        data: DataSource::Synthetic { train_len, val_len },
        width: 8,
        prefetch_batches: 1,
        seed: 5,
        ..TrainConfig::default()
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

#[test]
fn the_recipe_trains_on_cuda_like_on_the_cpu() {
    let Some(cuda) = cuda_device_or_skip() else {
        return;
    };
    let root = std::env::temp_dir().join(format!("kiln-cuda-train-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);

    let cpu = train(&config(root.join("cpu"), Device::Cpu), &mut Quiet).unwrap();
    let gpu = train(&config(root.join("cuda"), cuda), &mut Quiet).unwrap();
    // 256 / 32 = 8 batches per epoch (2 under emulation), 2 epochs.
    let (train_len, val_len) = samples();
    let batches = 2 * train_len / 32;
    assert_eq!(gpu.batch_losses.len(), batches);
    for (i, (c, g)) in cpu.batch_losses.iter().zip(&gpu.batch_losses).enumerate() {
        assert!(
            (c - g).abs() <= 1e-3 * c.abs().max(1.0),
            "batch {i}: CPU loss {c} vs CUDA {g}"
        );
    }
    let (c, g) = (&cpu.history[1], &gpu.history[1]);
    assert!(
        (c.val_accuracy - g.val_accuracy).abs() <= 2.0 / val_len as f64 + 1e-12,
        "validation accuracy: CPU {} vs CUDA {}",
        c.val_accuracy,
        g.val_accuracy
    );
    assert!(gpu
        .model
        .state_dict()
        .iter()
        .all(|(_, t)| t.device() == cuda));
    assert!(
        g.memory[2] > 0,
        "the CUDA run reported no peak memory: {g:?}"
    );

    let amp = train(
        &TrainConfig {
            amp: true,
            amp_dtype: DType::BF16,
            ..config(root.join("cuda-amp"), cuda)
        },
        &mut Quiet,
    )
    .unwrap();
    let losses = &amp.batch_losses;
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    // The last quarter of the batches against the first quarter.
    let quarter = batches / 4;
    assert!(
        mean(&losses[batches - quarter..]) < mean(&losses[..quarter]),
        "bf16 autocast on CUDA: loss did not fall: {losses:?}"
    );
    let (saved, _) = load_tensors(&amp.checkpoint).unwrap();
    for (name, t) in saved.iter().filter(|(n, _)| n.starts_with("model.")) {
        if !name.ends_with("num_batches_tracked") {
            assert_eq!(t.dtype(), DType::F32, "{name}");
        }
    }
    let _ = std::fs::remove_dir_all(&root);
}
