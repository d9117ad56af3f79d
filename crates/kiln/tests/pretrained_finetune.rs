//! Fine-tuning end to end from a file PyTorch wrote (tests/fixtures/make_pretrained.py:
//! torchvision's ResNet-18 at base width 4 with a 7-class head), on the 10-class synthetic set:
//! the head is replaced, the frozen first epoch leaves the whole backbone (parameters and
//! BatchNorm statistics) bit-identical to the file while the new head trains, and after the
//! resume into the unfrozen epoch the backbone moves at its own learning rate, a tenth of the
//! head's, as the epoch reports and metrics.csv show.
//!
//! One test per file: the recipe seeds kiln's process-wide generator.

mod common;

use common::logged;
use kiln::data::DataSource;
use kiln::models::LayerExt;
use kiln::recipe::{train, Arch, Observer, PretrainedReport, Setup, TrainConfig};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Keeps the setup's pretrained report.
#[derive(Default)]
struct Keep(Option<Option<PretrainedReport>>);

impl Observer for Keep {
    fn setup(&mut self, s: &Setup) {
        self.0 = Some(s.pretrained.clone());
    }
}

fn bits(
    tensors: impl IntoIterator<Item = (String, kiln::autograd::Tensor)>,
) -> HashMap<String, Vec<u64>> {
    tensors
        .into_iter()
        .map(|(n, t)| {
            let v = t.to_vec_f64().unwrap().into_iter().map(f64::to_bits);
            (n, v.collect())
        })
        .collect()
}

#[test]
fn fine_tune_keeps_the_frozen_backbone_then_trains_it_at_its_own_lr() {
    let pth = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/resnet18_w4.pth");
    let file = bits(kiln::models::pth::load_pth_tensors(&pth).unwrap());
    let run_dir: PathBuf =
        std::env::temp_dir().join(format!("kiln-finetune-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&run_dir);
    let config = TrainConfig {
        epochs: 2,
        freeze_epochs: 1,
        batch_size: Some(16),
        lr: 1e-2,
        backbone_lr_factor: 0.1,
        data: DataSource::Synthetic {
            train_len: 64,
            val_len: 32,
        },
        model: Arch::ResNet18,
        pretrained: Some(pth.clone()),
        run_dir: run_dir.clone(),
        prefetch_batches: 1,
        seed: 5,
        ..TrainConfig::default()
    };

    let mut keep = Keep::default();
    let frozen = train(
        &TrainConfig {
            stop_after: Some(1),
            ..config.clone()
        },
        &mut keep,
    )
    .unwrap();
    let report = keep.0.unwrap().expect("a pretrained report");
    assert_eq!(report.loaded, 120);
    assert_eq!(
        report.dropped_head,
        vec![
            ("fc.weight".to_string(), vec![7, 32]),
            ("fc.bias".to_string(), vec![7])
        ]
    );
    assert_eq!(frozen.model.fc.weight.shape(), &[10, 32]);
    assert!(frozen.history[0].frozen);
    // 64 / 16 = 4 steps.
    assert_eq!(frozen.batch_losses.len(), 4);
    assert!(frozen.batch_losses.iter().all(|l| l.is_finite()));

    let after_frozen = bits(frozen.model.state_dict());
    for (name, values) in &after_frozen {
        if name.starts_with("fc.") {
            continue;
        }
        assert!(values == &file[name], "{name} changed while frozen");
    }
    // The head trained: it is neither the file's (another shape) nor its fresh init.
    kiln::autograd::manual_seed(config.seed);
    let fresh = kiln::recipe::ModelConfig {
        in_channels: 3,
        image_size: [32, 32],
        num_classes: 10,
        width: 4,
        blocks: [2, 2, 2, 2],
        arch: Arch::ResNet18,
    }
    .build()
    .unwrap();
    let init = bits(fresh.state_dict());
    assert_ne!(after_frozen["fc.weight"], init["fc.weight"]);
    assert_ne!(after_frozen["fc.bias"], init["fc.bias"]);
    drop(frozen);

    // Resume into the unfrozen epoch: the checkpoint records the arch, the weights come from it.
    let mut keep = Keep::default();
    let done = train(
        &TrainConfig {
            resume: true,
            ..config.clone()
        },
        &mut keep,
    )
    .unwrap();
    assert_eq!(keep.0, Some(None), "a resumed run loads no pretrained file");
    assert_eq!(done.history.len(), 2);
    assert!(!done.history[1].frozen);
    // The cosine ends at 0 after the last step; the first epoch ends mid-schedule.
    assert_eq!(done.history[1].lr, [0.0, 0.0]);
    let [backbone_lr, head_lr] = done.history[0].lr;
    assert!(head_lr > 1e-3);
    assert!(
        (backbone_lr / head_lr - 0.1).abs() < 1e-12,
        "{backbone_lr} / {head_lr}"
    );
    let after = bits(done.model.state_dict());
    let moved = after
        .iter()
        .filter(|(n, v)| n.ends_with(".weight") && !n.starts_with("fc.") && *v != &file[*n])
        .count();
    // Every convolution and BatchNorm weight of the backbone: 20 + 20.
    assert_eq!(moved, 40);

    // metrics.csv: every step of the unfrozen epoch (but the last, at lr 0) logs the backbone's
    // lr as a tenth of the head's.
    let lr_at = |tag: &str| -> HashMap<usize, f64> { logged(&run_dir, tag).into_iter().collect() };
    let (backbone, head) = (lr_at("lr/backbone"), lr_at("lr/head"));
    assert_eq!(backbone.len(), 8);
    assert_eq!((backbone[&8], head[&8]), (0.0, 0.0));
    for step in 5..=7 {
        assert!(head[&step] > 1e-4, "step {step}: {}", head[&step]);
        let ratio = backbone[&step] / head[&step];
        assert!((ratio - 0.1).abs() < 1e-9, "step {step}: {ratio}");
    }
    std::fs::remove_dir_all(&run_dir).unwrap();
}
