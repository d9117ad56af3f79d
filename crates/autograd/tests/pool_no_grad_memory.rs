//! Max pooling keeps its argmax indices (8 bytes per output) only when a backward can follow:
//! under `no_grad`, or on an input that needs no gradient, it allocates its output alone and
//! gives the same values. Measured with the CPU caching allocator's statistics, so its own test
//! binary (that allocator is process-wide).

use kiln_autograd::{no_grad, DType, Device, MaxPool2dParams, Tensor};
use kiln_device::{max_memory_allocated, memory_allocated, reset_peak_memory_stats};

/// Bytes the CPU allocator handed out at its peak while `f` ran, above what was live before.
fn grew_by(f: impl FnOnce() -> Tensor) -> (usize, Tensor) {
    reset_peak_memory_stats(Device::Cpu).unwrap();
    let base = memory_allocated(Device::Cpu).unwrap();
    let y = f();
    (max_memory_allocated(Device::Cpu).unwrap() - base, y)
}

#[test]
fn max_pooling_keeps_indices_only_for_a_backward() {
    let params = MaxPool2dParams {
        stride: [2, 2],
        padding: [1, 1],
        ..MaxPool2dParams::new([3, 3])
    };
    let x = Tensor::randn(&[2, 8, 32, 32], DType::F32, Device::Cpu).unwrap();
    // [2, 8, 16, 16]: 4096 outputs, 16 KiB of f32 and 32 KiB of i64 indices.
    let outputs = 2 * 8 * 16 * 16;
    let (values_only, y) = grew_by(|| x.max_pool2d(params).unwrap());
    assert_eq!(values_only, 4 * outputs, "an input that needs no gradient");
    let want = y.to_vec::<f32>().unwrap();

    let x = x.set_requires_grad(true).unwrap();
    let (no_grad_bytes, y) = grew_by(|| no_grad(|| x.max_pool2d(params)).unwrap());
    assert_eq!(no_grad_bytes, 4 * outputs, "under no_grad");
    assert_eq!(y.to_vec::<f32>().unwrap(), want);
    assert!(y.grad_fn_name().is_none());

    let (with_indices, y) = grew_by(|| x.max_pool2d(params).unwrap());
    assert_eq!(with_indices, (4 + 8) * outputs, "with a backward to follow");
    assert_eq!(y.to_vec::<f32>().unwrap(), want);
    // Each output sends its gradient of one to its window's maximum.
    y.sum_all().unwrap().backward().unwrap();
    let grad = x.grad().unwrap().to_vec::<f32>().unwrap();
    assert_eq!(grad.iter().sum::<f32>(), outputs as f32);
}
