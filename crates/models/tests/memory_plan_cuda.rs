//! The memory plan for a CUDA step against the device's caching allocator: real training steps
//! of torchvision's ResNet (BasicBlock, [1, 1, 1, 1], small-input stem) on a CUDA device, where
//! the convolutions' column matrices are among the largest buffers of the step. `plan_on` adds
//! them (`kiln_device::ops::conv::cuda_conv2d_workspace`); `plan` (tensors only) does not.
//!
//! Its own test binary: nothing else may allocate on the device while it is measured. Without a
//! usable device it prints why and passes (fails with `KILN_REQUIRE_CUDA=1`).

mod common;

use common::{sgd_momentum, sgd_momentum_step};
use kiln_autograd::{manual_seed, DType, Device, Module, Tensor};
use kiln_device::{max_memory_allocated, memory_allocated, reset_peak_memory_stats};
use kiln_models::{plan, plan_on, LayerExt, OptimizerKind};

#[test]
fn cuda_training_peak_matches_the_plan_with_the_convolutions_scratch() {
    let Some(dev) = kiln_device::testing::cuda_device_or_skip() else {
        return;
    };
    manual_seed(0);
    // Whatever the device keeps for good (library handles) is created before counting starts.
    let warm = Tensor::ones(&[4, 4], DType::F32, dev).unwrap();
    drop(warm.matmul(&warm).unwrap());
    drop(warm);
    let base = memory_allocated(dev).unwrap();
    let model = common::tiny_resnet(10, true);
    model.to_device(dev).unwrap();
    let mut opt = sgd_momentum(&model);
    let shape = [3, 16, 16];
    let on_device = plan_on(&model, &shape, DType::F32, OptimizerKind::SgdMomentum, dev).unwrap();
    let tensors = plan(&model, &shape, DType::F32, OptimizerKind::SgdMomentum).unwrap();
    assert_eq!(on_device.device, Some(dev));
    for batch in [2usize, 32] {
        let x = Tensor::randn(
            &[batch, shape[0], shape[1], shape[2]],
            DType::F32,
            Device::Cpu,
        )
        .unwrap()
        .to_device(dev)
        .unwrap();
        // A first step creates the gradients and momentum buffers; the second is measured.
        sgd_momentum_step(&model, &mut opt, &x);
        model.zero_grad(true).unwrap();
        reset_peak_memory_stats(dev).unwrap();
        sgd_momentum_step(&model, &mut opt, &x);
        model.zero_grad(true).unwrap();
        let measured = max_memory_allocated(dev).unwrap() - base;
        let with_scratch = on_device.peak_allocated_bytes(batch) as f64 / measured as f64;
        let without = tensors.peak_allocated_bytes(batch) as f64 / measured as f64;
        println!(
            "batch {batch}: measured {measured} B; plan_on {with_scratch:.3}, plan (tensors \
             only) {without:.3}"
        );
        assert!(
            (0.97..=1.03).contains(&with_scratch),
            "batch {batch}: {with_scratch:.3}"
        );
        assert!(without < with_scratch, "batch {batch}");
        if batch == 32 {
            // The scratch grows with the batch: here it is a visible part of the step.
            assert!(without < 0.9, "batch {batch}: {without:.3}");
        }
    }
}
