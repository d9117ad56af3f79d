//! Helpers shared by the recipe's integration tests: a test-sized configuration and the
//! bit-for-bit comparison of two trained models.
#![allow(dead_code)]

use kiln::data::DataSource;
use kiln::models::LayerExt;
use kiln::recipe::TrainConfig;
use std::path::PathBuf;

/// The recipe at test size: two epochs of batch 16 on `train_len` synthetic images (validated
/// on `val_len`), lr 1e-2, width 4, one prefetched batch, seeded with `seed`, in `run_dir`;
/// every other knob at its default.
pub fn tiny_config(
    run_dir: PathBuf,
    seed: u64,
    (train_len, val_len): (usize, usize),
) -> TrainConfig {
    TrainConfig {
        epochs: 2,
        batch_size: Some(16),
        lr: 1e-2,
        run_dir,
        data: DataSource::Synthetic { train_len, val_len },
        width: 4,
        prefetch_batches: 1,
        seed,
        ..TrainConfig::default()
    }
}

/// Every state-dict tensor of `model` as the bit patterns of its values (as f64), by name: two
/// models are bit-identical when these are equal.
pub fn bits(model: &kiln::models::models::ResNet) -> Vec<(String, Vec<u64>)> {
    model
        .state_dict()
        .into_iter()
        .map(|(n, t)| {
            let v = t.to_vec_f64().unwrap().into_iter().map(f64::to_bits);
            (n, v.collect())
        })
        .collect()
}

/// Asserts two [`bits`] lists name the same tensors with the same bits.
pub fn assert_same_bits(a: &[(String, Vec<u64>)], b: &[(String, Vec<u64>)]) {
    assert_eq!(a.len(), b.len());
    for ((na, va), (nb, vb)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        assert!(va == vb, "{na} differs after resume");
    }
}
