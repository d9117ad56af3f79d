//! `amp`: the recipe trains under autocast on the CPU — bf16 without loss scaling, f16 with a
//! `GradScaler` — with finite, falling losses and the true gradient norm clipped and logged
//! (and an accumulated step's the mean's), while parameters and the checkpoint stay f32.
//! One test in this file: the recipe seeds kiln's process-wide generator, so two runs must not
//! overlap in one process.

mod common;

use common::{logged, tiny_config};
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
    let mut epoch_norms = Vec::new();
    for dtype in [DType::BF16, DType::F16] {
        let out = train(&config(root.join(format!("{dtype}")), dtype), &mut Quiet).unwrap();
        epoch_norms.push((dtype, out.history[0].grad_norm));
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
    // The norm clipped and logged is the true gradient's (unscaled first): within a few percent
    // of an f32 run's, not times f16's loss scale (2^16 at the start). Each epoch report's is
    // the mean of its steps' logged norms.
    let f32_config = TrainConfig {
        amp: false,
        ..config(root.join("f32"), DType::F32)
    };
    let f32_run = train(&f32_config, &mut Quiet).unwrap();
    let want = f32_run.history[0].grad_norm;
    // Two accumulated batches of 8 make one step over the mean of 16 samples' losses: a norm
    // within a few percent of the batch-16 run's (BatchNorm's batch statistics differ), not
    // twice it (each batch's loss not divided by its group's length).
    let accum_config = TrainConfig {
        batch_size: Some(8),
        accum_steps: 2,
        run_dir: root.join("accum"),
        ..f32_config.clone()
    };
    let accum = train(&accum_config, &mut Quiet).unwrap();
    let ratio = accum.history[0].grad_norm / want;
    println!("accumulated 2 x 8: epoch-1 gradient norm ratio {ratio:.4} to batch 16");
    assert!((0.9..1.1).contains(&ratio), "{ratio}");
    for (dtype, norm) in &epoch_norms {
        let ratio = norm / want;
        println!("{dtype}: epoch-1 gradient norm {norm:.5} vs f32 {want:.5} (ratio {ratio:.4})");
        assert!((0.9..1.1).contains(&ratio), "{dtype}: {norm} vs f32 {want}");
    }
    for dir in ["bfloat16", "float16", "f32"] {
        let steps: Vec<f64> = logged(&root.join(dir), "train/grad_norm")
            .into_iter()
            .filter_map(|(step, norm)| (step <= 6).then_some(norm))
            .collect();
        assert_eq!(steps.len(), 6, "{dir}");
        let report = match dir {
            "f32" => want,
            "bfloat16" => epoch_norms[0].1,
            _ => epoch_norms[1].1,
        };
        assert!(
            (mean(&steps) - report).abs() <= 1e-9 * report,
            "{dir}: {steps:?} vs {report}"
        );
    }
    let _ = std::fs::remove_dir_all(&root);
}
