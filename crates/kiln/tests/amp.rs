//! `amp`: the recipe trains under autocast on the CPU — bf16 without loss scaling, f16 with a
//! `GradScaler` — with finite, falling losses, while parameters and the checkpoint stay f32.
//! One test in this file: the recipe seeds kiln's process-wide generator, so two runs must not
//! overlap in one process.

mod common;

use common::tiny_config;
use kiln::device::DType;
use kiln::models::checkpoint::load_tensors;
use kiln::models::LayerExt;
use kiln::recipe::{train, Quiet, TrainConfig};

fn config(run_dir: std::path::PathBuf, amp_dtype: DType) -> TrainConfig {
    TrainConfig {
        freeze_epochs: 0,
        augment: false,
        amp: true,
        amp_dtype,
        ..tiny_config(run_dir, 3, (96, 16))
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

#[test]
fn amp_trains_on_the_cpu_with_f32_checkpoints() {
    let root = std::env::temp_dir().join(format!("kiln-amp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for dtype in [DType::BF16, DType::F16] {
        let out = train(&config(root.join(format!("{dtype}")), dtype), &mut Quiet).unwrap();
        let losses = &out.batch_losses;
        // 96 / 16 = 6 batches per epoch, 2 epochs.
        assert_eq!(losses.len(), 12, "{dtype}");
        assert!(losses.iter().all(|l| l.is_finite()), "{dtype}: {losses:?}");
        assert!(
            mean(&losses[9..]) < mean(&losses[..3]),
            "{dtype}: loss did not fall: {losses:?}"
        );
        assert!(out.history.iter().all(|r| r.grad_norm.is_finite()));
        // Parameters, buffers and the checkpoint stay in their own dtypes: f32 floats.
        let (saved, _) = load_tensors(&out.checkpoint).unwrap();
        let model: Vec<_> = saved
            .iter()
            .filter(|(n, _)| n.starts_with("model."))
            .collect();
        assert_eq!(model.len(), out.model.state_dict().len());
        for (name, t) in model {
            if !name.ends_with("num_batches_tracked") {
                assert_eq!(t.dtype(), DType::F32, "{dtype}: {name}");
            }
        }
        for (name, t) in out.model.state_dict() {
            if !name.ends_with("num_batches_tracked") {
                assert_eq!(t.dtype(), DType::F32, "{dtype}: {name}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&root);
}
