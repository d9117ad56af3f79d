//! The memory plan for a CUDA step against the device's caching allocator: real training steps
//! of torchvision's ResNet (BasicBlock, [1, 1, 1, 1], small-input stem) on a CUDA device, where
//! the convolutions' column matrices are among the largest buffers of the step. `plan_on` adds
//! them (`kiln_device::ops::conv::cuda_conv2d_workspace`); `plan` (tensors only) does not.
//!
//! With a small column budget (`set_cuda_conv_column_budget`) the convolutions unfold a few
//! images at a time and the plan must follow the scratch that stops growing with the batch.
//!
//! Its own test binary: nothing else may allocate on the device while it is measured, nor
//! change the process-wide column budget. Without a
//! usable device it prints why and passes (fails with `KILN_REQUIRE_CUDA=1`).

mod common;

use common::{sgd_momentum, sgd_momentum_step};
use kiln_autograd::{manual_seed, DType, Device, Module, Tensor};
use kiln_device::ops::conv::{cuda_conv_column_budget, set_cuda_conv_column_budget};
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
    let tensors = plan(&model, &shape, DType::F32, OptimizerKind::SgdMomentum).unwrap();
    let default_budget = cuda_conv_column_budget();
    let mut whole_batch_peak = 0;
    // The default column budget holds every layer's whole batch here; 64 KiB makes the early
    // layers unfold a few images at a time, so their scratch stops growing with the batch.
    for (batch, budget) in [
        (2usize, default_budget),
        (32, default_budget),
        (32, 64 << 10),
    ] {
        set_cuda_conv_column_budget(budget).unwrap();
        let on_device =
            plan_on(&model, &shape, DType::F32, OptimizerKind::SgdMomentum, dev).unwrap();
        assert_eq!(on_device.device, Some(dev));
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
            "batch {batch}, column budget {budget} B: measured {measured} B; plan_on \
             {with_scratch:.3}, plan (tensors only) {without:.3}"
        );
        assert!(
            (0.97..=1.03).contains(&with_scratch),
            "batch {batch}, budget {budget}: {with_scratch:.3}"
        );
        // With a small budget the scratch can fall below the step's other moments.
        assert!(without <= with_scratch, "batch {batch}");
        if batch == 32 && budget == default_budget {
            // The scratch grows with the batch: here it is a visible part of the step.
            assert!(without < 0.9, "batch {batch}: {without:.3}");
            whole_batch_peak = measured;
        } else if batch == 32 {
            // Unfolding a few images at a time holds less.
            assert!(
                measured < whole_batch_peak,
                "{measured} vs {whole_batch_peak}"
            );
        }
    }
    set_cuda_conv_column_budget(default_budget).unwrap();
}
