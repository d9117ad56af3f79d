//! In-place arithmetic allocates nothing the size of the tensor on the CPU: measured with the
//! CPU caching allocator's statistics. Its own test binary: that allocator is process-wide.

use kiln_autograd::{DType, Device, Tensor};
use kiln_device::{max_memory_allocated, memory_allocated, reset_peak_memory_stats};

#[test]
fn in_place_arithmetic_allocates_no_tensor_sized_buffer() {
    let cpu = Device::Cpu;
    let n = 1 << 20; // 4 MiB of f32
    let x = Tensor::zeros(&[n], DType::F32, cpu).unwrap();
    let ones = Tensor::ones(&[n], DType::F32, cpu).unwrap();
    let row = Tensor::ones(&[1, 1024], DType::F32, cpu).unwrap();
    let grid = x.reshape(&[1024, 1024]).unwrap();
    reset_peak_memory_stats(cpu).unwrap();
    let base = memory_allocated(cpu).unwrap();
    x.add_(&ones).unwrap();
    x.mul_scalar_(3.0).unwrap();
    x.sub_(&ones).unwrap();
    grid.div_(&row).unwrap();
    let grew = max_memory_allocated(cpu).unwrap() - base;
    // Only the 0-d scalar of mul_scalar_ (one 512-byte block) may be allocated.
    assert!(grew <= 512, "in-place updates allocated {grew} bytes");
    assert!(x.to_vec::<f32>().unwrap().iter().all(|&v| v == 2.0));
    // Half precision is updated in place too (computed in f32 element by element).
    for dtype in [DType::F16, DType::BF16] {
        let h = Tensor::ones(&[n], dtype, cpu).unwrap();
        let h_ones = Tensor::ones(&[n], dtype, cpu).unwrap();
        reset_peak_memory_stats(cpu).unwrap();
        let base = memory_allocated(cpu).unwrap();
        h.add_(&h_ones).unwrap();
        h.mul_(&h_ones).unwrap();
        let grew = max_memory_allocated(cpu).unwrap() - base;
        assert_eq!(grew, 0, "{dtype}: in-place updates allocated {grew} bytes");
        let back = h.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        assert!(back.iter().all(|&v| v == 2.0), "{dtype}");
    }
    // A strided destination is updated in place as well.
    reset_peak_memory_stats(cpu).unwrap();
    let base = memory_allocated(cpu).unwrap();
    let ones_grid = ones.reshape(&[1024, 1024]).unwrap();
    grid.t().unwrap().add_(&ones_grid).unwrap();
    grid.narrow(1, 0, 512)
        .unwrap()
        .mul_(&ones_grid.narrow(1, 0, 512).unwrap())
        .unwrap();
    let strided = max_memory_allocated(cpu).unwrap() - base;
    assert_eq!(
        strided, 0,
        "strided in-place updates allocated {strided} bytes"
    );
    assert!(x.to_vec::<f32>().unwrap().iter().all(|&v| v == 3.0));
    // add_scaled_ is one fused kernel: no `alpha * other` buffer.
    let (h, h_ones) = (
        Tensor::ones(&[n], DType::BF16, cpu).unwrap(),
        Tensor::ones(&[n], DType::BF16, cpu).unwrap(),
    );
    reset_peak_memory_stats(cpu).unwrap();
    let base = memory_allocated(cpu).unwrap();
    x.add_scaled_(&ones, -0.5).unwrap();
    grid.t().unwrap().add_scaled_(&ones_grid, 0.25).unwrap();
    h.add_scaled_(&h_ones, 2.0).unwrap();
    let scaled = max_memory_allocated(cpu).unwrap() - base;
    assert_eq!(scaled, 0, "add_scaled_ allocated {scaled} bytes");
    assert!(x.to_vec::<f32>().unwrap().iter().all(|&v| v == 2.75));
    let back = h.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    assert!(back.iter().all(|&v| v == 3.0));
    // An inference pass's ReLU and residual sum over a tensor no one else holds: in place,
    // only ReLU's 0-d zero allocated.
    let act = Tensor::full(&[n], -1.5, DType::F32, cpu).unwrap();
    reset_peak_memory_stats(cpu).unwrap();
    let base = memory_allocated(cpu).unwrap();
    let out = kiln_autograd::no_grad(|| act.into_add(&ones)?.into_relu()).unwrap();
    let owned = max_memory_allocated(cpu).unwrap() - base;
    assert!(owned <= 512, "into_add + into_relu allocated {owned} bytes");
    assert!(out.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0));
}
