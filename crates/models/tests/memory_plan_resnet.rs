//! The memory plan against the caching allocator on a convolutional network: real CPU training
//! steps of torchvision's ResNet (BasicBlock, [1, 1, 1, 1], small-input stem) at two batch sizes.
//! Its own test binary: the CPU allocator is process-wide.

use kiln_autograd::{manual_seed, DType, Device, Module, Tensor};
use kiln_device::{max_memory_allocated, memory_allocated, reset_peak_memory_stats};
use kiln_models::models::{BlockKind, ResNet, ResNetConfig};
use kiln_models::{plan, Freeze, Layer, OptimizerKind};

/// One SGD-with-momentum step (the momentum buffers are the caller's), as an optimizer does.
fn step(model: &dyn Layer, state: &[Tensor], x: &Tensor) {
    let loss = model
        .forward(x)
        .unwrap()
        .square()
        .unwrap()
        .mean_all()
        .unwrap();
    loss.backward().unwrap();
    let _g = kiln_autograd::NoGradGuard::new();
    for (p, m) in model.parameters().iter().zip(state) {
        let Some(g) = p.grad() else { continue };
        m.mul_scalar_(0.9).unwrap();
        m.add_(&g).unwrap();
        p.add_scaled_(m, -0.01).unwrap();
    }
}

#[test]
fn resnet_training_peak_is_within_ten_percent_of_the_plan() {
    manual_seed(0);
    let cpu = Device::Cpu;
    let base = memory_allocated(cpu).unwrap();
    let model = ResNet::new(ResNetConfig {
        block: BlockKind::Basic,
        layers: [1, 1, 1, 1],
        num_classes: 10,
        small_input: true,
    })
    .unwrap();
    let state: Vec<Tensor> = model
        .parameters()
        .iter()
        .map(|p| p.zeros_like().unwrap())
        .collect();
    let p = plan(&model, &[3, 32, 32], DType::F32, OptimizerKind::SgdMomentum).unwrap();
    // Batch 2: the optimizer step's temporaries (two 512x512x3x3 weights) are the peak;
    // batch 32: the activations kept for backward are.
    for batch in [2usize, 32] {
        let x = Tensor::randn(&[batch, 3, 32, 32], DType::F32, cpu).unwrap();
        step(&model, &state, &x); // gradients exist from here on, as in steady state
        model.zero_grad(true).unwrap();
        reset_peak_memory_stats(cpu).unwrap();
        step(&model, &state, &x);
        model.zero_grad(true).unwrap();
        let measured = max_memory_allocated(cpu).unwrap() - base;
        let predicted = p.peak_allocated_bytes(batch);
        let ratio = predicted as f64 / measured as f64;
        println!("batch {batch}: predicted {predicted} B, max_memory_allocated {measured} B, ratio {ratio:.3}");
        assert!(
            (0.9..=1.1).contains(&ratio),
            "batch {batch}: ratio {ratio:.3}"
        );
    }

    // Saved activations of a training forward (allocated after forward minus before, less the
    // output), with the whole network trainable and with only `fc` trainable.
    let x = Tensor::randn(&[32, 3, 32, 32], DType::F32, cpu).unwrap();
    let saved_by_forward = || {
        let before = memory_allocated(cpu).unwrap();
        let out = model.forward(&x).unwrap();
        // The allocator hands out 512-byte multiples.
        memory_allocated(cpu).unwrap() - before - (out.numel() * 4).div_ceil(512) * 512
    };
    let full = saved_by_forward();
    let full_plan = plan(&model, &[3, 32, 32], DType::F32, OptimizerKind::SgdMomentum).unwrap();
    let predicted =
        32 * full_plan.saved_activation_bytes_per_sample + full_plan.saved_activation_bytes_fixed;
    let ratio = predicted as f64 / full as f64;
    assert!((0.99..=1.01).contains(&ratio), "{predicted} vs {full}");
    model.freeze(|n| !n.starts_with("fc.")).unwrap();
    let frozen = saved_by_forward();
    let drop = 100.0 * (1.0 - frozen as f64 / full as f64);
    println!("saved activations at batch 32: {full} B trainable, {frozen} B with a frozen backbone ({drop:.2}% less)");
    let frozen_plan = plan(&model, &[3, 32, 32], DType::F32, OptimizerKind::SgdMomentum).unwrap();
    assert_eq!(frozen, 32 * frozen_plan.saved_activation_bytes_per_sample);
    assert!(drop > 99.0, "{drop}");
}
