//! The memory plan against the caching allocator: real CPU training steps at two batch sizes,
//! predicted peak vs `max_memory_allocated`. Its own test binary (one test) because the CPU
//! allocator is process-wide and other tests would move its peak.

mod common;

use common::{
    assert_within_ten_percent, sgd_momentum, sgd_momentum_step as step, steady_state_peak,
};
use kiln_autograd::{manual_seed, DType, Device, Module, Tensor};
use kiln_device::{max_memory_allocated, memory_allocated, reset_peak_memory_stats};
use kiln_models::models::mlp;
use kiln_models::{plan, Freeze, OptimizerKind};

#[test]
fn predicted_peak_is_within_ten_percent_of_max_memory_allocated() {
    manual_seed(0);
    let cpu = Device::Cpu;
    let base = memory_allocated(cpu).unwrap();
    let model = mlp(&[128, 512, 512, 10], 0.0).unwrap();
    let mut opt = sgd_momentum(&model);
    let p = plan(&model, &[128], DType::F32, OptimizerKind::SgdMomentum).unwrap();
    for batch in [256usize, 2048] {
        let x = Tensor::randn(&[batch, 128], DType::F32, cpu).unwrap();
        let measured = steady_state_peak(&model, &mut opt, &x, base);
        assert_within_ten_percent(batch, p.peak_allocated_bytes(batch), measured);
    }

    // Freezing the backbone: the measured peak drops, and the plan still predicts it.
    let batch = 2048;
    let x = Tensor::randn(&[batch, 128], DType::F32, cpu).unwrap();
    reset_peak_memory_stats(cpu).unwrap();
    step(&model, &mut opt, &x);
    let full = max_memory_allocated(cpu).unwrap() - base;
    model.zero_grad(true).unwrap();
    model.freeze(|n| !n.starts_with("4.")).unwrap();
    let frozen_plan = plan(&model, &[128], DType::F32, OptimizerKind::SgdMomentum).unwrap();
    step(&model, &mut opt, &x);
    model.zero_grad(true).unwrap();
    reset_peak_memory_stats(cpu).unwrap();
    step(&model, &mut opt, &x);
    let frozen = max_memory_allocated(cpu).unwrap() - base;
    let drop = 100.0 * (1.0 - frozen as f64 / full as f64);
    let ratio = frozen_plan.peak_allocated_bytes(batch) as f64 / frozen as f64;
    println!("frozen backbone at batch {batch}: peak {full} B -> {frozen} B ({drop:.1}% less); plan ratio {ratio:.3}");
    // The full step's peak is now its forward (the second Linear's matmul result next to its
    // input): since ReLU's backward writes over the gradient it reads, no moment of backward
    // holds more. Frozen, the first Linear keeps no input for a weight gradient, so that
    // moment holds one batch of inputs less (6.2% when measured). (The drop was 20.5% while
    // backward set the peak, over 30% while relu's backward made a mask and then a product.)
    assert!(drop > 4.0, "{drop}");
    assert!((0.9..=1.1).contains(&ratio), "frozen: ratio {ratio:.3}");
}
