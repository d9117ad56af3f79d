//! Run-to-run repeatability on CUDA (docs/GPU.md, item 7): the same recipe run twice on
//! `cuda:0` from the same seed gives bit-identical batch losses and trained tensors, in f32 and
//! under bf16 autocast. Nothing on that path adds in an order that varies: the reductions are
//! two-pass and deterministic, cuBLAS is deterministic on one GPU and stream, and the atomic
//! additions it meets each add one value into a zeroed element (global average pooling's
//! backward, whose windows do not overlap) or add integers exactly (cross-entropy's weight sum).
//! Skips without a usable device; fails instead under `KILN_REQUIRE_CUDA=1`.
//!
//! One test in this file: the recipe seeds kiln's process-wide generator, so two runs must not
//! overlap in one process.

mod common;

use common::{assert_same_bits, bits, tiny_config};
use kiln::device::testing::cuda_device_or_skip;
use kiln::device::DType;
use kiln::recipe::{train, Quiet, TrainConfig};

#[test]
fn the_same_cuda_run_twice_gives_the_same_bits() {
    let Some(cuda) = cuda_device_or_skip() else {
        return;
    };
    let root = std::env::temp_dir().join(format!("kiln-cuda-repeat-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for (label, amp) in [("f32", false), ("bf16-autocast", true)] {
        let run = |n: usize| {
            // Two epochs (the first with the backbone frozen) of two batches of 16.
            let config = TrainConfig {
                device: cuda,
                width: 8,
                amp,
                amp_dtype: DType::BF16,
                ..tiny_config(root.join(format!("{label}-{n}")), 11, (32, 16))
            };
            train(&config, &mut Quiet).unwrap()
        };
        let (first, second) = (run(1), run(2));
        assert_eq!(first.batch_losses.len(), 4, "{label}");
        let losses = |l: &[f64]| l.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            losses(&first.batch_losses),
            losses(&second.batch_losses),
            "{label}: batch losses {:?} then {:?}",
            first.batch_losses,
            second.batch_losses
        );
        assert_same_bits(&bits(&first.model), &bits(&second.model));
    }
    let _ = std::fs::remove_dir_all(&root);
}
