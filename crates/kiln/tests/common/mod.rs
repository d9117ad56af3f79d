//! Helpers shared by the recipe's integration tests: a test-sized configuration and the
//! bit-for-bit comparison of two trained models.
#![allow(dead_code)]

use kiln::data::DataSource;
use kiln::models::LayerExt;
use kiln::recipe::TrainConfig;
use std::path::{Path, PathBuf};

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

/// The `(step, value)` rows the run in `run_dir` logged under `tag` in its `metrics.csv`
/// (`wall_time,step,tag,value` lines), in file order.
pub fn logged(run_dir: &Path, tag: &str) -> Vec<(usize, f64)> {
    let csv = std::fs::read_to_string(run_dir.join("metrics.csv")).unwrap();
    csv.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f.get(2) == Some(&tag)).then(|| (f[1].parse().unwrap(), f[3].parse().unwrap()))
        })
        .collect()
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
        assert!(va == vb, "{na}: the bits differ");
    }
}

/// One 64-bit FNV-1a digest of [`bits`]: two ranks print it to show they hold the same state.
pub fn digest(bits: &[(String, Vec<u64>)]) -> u64 {
    bits.iter()
        .flat_map(|(_, v)| v.iter())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b).wrapping_mul(0x0100_0000_01b3)
        })
}

/// The largest difference between two state dicts' tensors relative to the tensor's scale
/// (`max |a - b| / max |b|`), with the tensor's name.
pub fn max_rel_diff(
    a: &[(String, kiln::autograd::Tensor)],
    b: &[(String, kiln::autograd::Tensor)],
) -> (f64, String) {
    assert_eq!(a.len(), b.len());
    let mut worst = (0.0f64, String::new());
    for ((na, ta), (nb, tb)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        let (va, vb) = (ta.to_vec_f64().unwrap(), tb.to_vec_f64().unwrap());
        let scale = vb.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-30);
        let diff = va
            .iter()
            .zip(&vb)
            .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
        if diff / scale > worst.0 {
            worst = (diff / scale, na.clone());
        }
    }
    worst
}

/// Asserts that the recipe's checkpoint in `root/two` (trained on several ranks) equals the one in
/// `root/one` (one process over the concatenated batches) to `max |a - b| / max |b| < 1e-4` per
/// tensor, and that training moved the one-process model far beyond that from its init (drawn
/// again under `seed`); prints the measured difference, headed by `what`.
pub fn assert_ranks_match_one_process(root: &Path, what: &str, seed: u64) {
    let load = |dir: &str| {
        let path = kiln::recipe::checkpoint_path(&root.join(dir));
        kiln::recipe::checkpoint::load_model(&path).unwrap()
    };
    let (two, _) = load("two");
    let (one, info) = load("one");
    let (worst, at) = max_rel_diff(&two.state_dict(), &one.state_dict());
    println!("{what}: max relative difference {worst:.2e} at {at}");
    assert!(worst < 1e-4, "{at}: {worst}");
    kiln::autograd::manual_seed(seed);
    let init = info.config.build().unwrap();
    let (moved, at) = max_rel_diff(&one.state_dict(), &init.state_dict());
    assert!(moved > 1e-2, "{at}: training moved only {moved}");
}
