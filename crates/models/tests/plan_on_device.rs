//! `plan_on`: the plan of a step on a named device, without running anything there (the trace is
//! shapes only, so a CUDA plan is made on a machine without a GPU).

use kiln_autograd::DType;
use kiln_device::ops::conv::{cuda_conv2d_workspace, Conv2dGeometry, Conv2dParams};
use kiln_device::{Device, GradMask};
use kiln_models::layers::{Conv2d, Conv2dConfig};
use kiln_models::models::resnet18;
use kiln_models::{plan, plan_on, OptimizerKind};

#[test]
fn cpu_plan_is_the_tensor_plan_and_cuda_adds_the_convolutions_scratch() {
    let model = resnet18(10).unwrap();
    let shape = [3, 32, 32];
    let opt = OptimizerKind::SgdMomentum;
    let tensors = plan(&model, &shape, DType::F32, opt).unwrap();
    let cpu = plan_on(&model, &shape, DType::F32, opt, Device::Cpu).unwrap();
    let cuda = plan_on(&model, &shape, DType::F32, opt, Device::Cuda(0)).unwrap();
    assert_eq!(tensors.device, None);
    assert_eq!(cpu.device, Some(Device::Cpu));
    for b in [1, 2, 7, 64, 512] {
        assert_eq!(cpu.peak_allocated_bytes(b), tensors.peak_allocated_bytes(b));
        assert!(
            cuda.peak_allocated_bytes(b) > tensors.peak_allocated_bytes(b),
            "batch {b}"
        );
    }
    // The scratch grows with the batch, so the CUDA plan allows a smaller batch.
    let budget = 4 << 30;
    let (on_cuda, anywhere) = (
        cuda.max_batch_size(budget).unwrap(),
        tensors.max_batch_size(budget).unwrap(),
    );
    assert!(on_cuda < anywhere, "{on_cuda} vs {anywhere}");
    assert!(cuda
        .to_string()
        .contains("Kernel scratch: cuda:0 convolutions included"));
    assert!(tensors.to_string().contains("tensors only"));
}

#[test]
fn the_cuda_scratch_stops_growing_at_the_column_budget() {
    // ResNet-18 at 224x224: the stem unfolds 7.4 MB of columns per image, a 1x1 downsample of
    // layer4 50 KB; with the default 64 MiB budget every pass unfolds at most 1342 images at a
    // time, so from there on the CUDA plan exceeds the tensors-only plan by a constant.
    let model = resnet18(1000).unwrap();
    let shape = [3, 224, 224];
    let opt = OptimizerKind::SgdMomentum;
    let tensors = plan(&model, &shape, DType::F32, opt).unwrap();
    let cuda = plan_on(&model, &shape, DType::F32, opt, Device::Cuda(0)).unwrap();
    let extra = |b| cuda.peak_allocated_bytes(b) - tensors.peak_allocated_bytes(b);
    assert_eq!(extra(2048), extra(4096));
    assert_eq!(extra(4096), extra(100_000));
    // A chunk's columns, its transposed output gradient, and the rest of the step's moment.
    assert!(extra(4096) < 256 << 20, "{}", extra(4096));
    // Below the limit the scratch still grows with the batch.
    assert!(extra(1) < extra(8), "{} vs {}", extra(1), extra(8));
}

#[test]
fn one_convolution_peaks_at_its_weight_gradients_scratch() {
    // A convolution of the model's input: backward computes the weight and bias gradients
    // only, which is what the workspace is asked for here.
    let conv = Conv2d::new(8, 16, 3, Conv2dConfig::default().padding(1)).unwrap();
    let shape = [8, 20, 20];
    let opt = OptimizerKind::Sgd;
    let tensors = plan(&conv, &shape, DType::F32, opt).unwrap();
    let cuda = plan_on(&conv, &shape, DType::F32, opt, Device::Cuda(0)).unwrap();
    let batch = 64;
    let geometry = Conv2dGeometry::new(
        [batch, 8, 20, 20],
        [16, 8, 3, 3],
        Conv2dParams {
            padding: [1, 1],
            ..Conv2dParams::default()
        },
    )
    .unwrap();
    let mask = GradMask {
        input: false,
        weight: true,
        bias: true,
    };
    let ws = cuda_conv2d_workspace(&geometry, DType::F32, mask).unwrap();
    assert!(ws.forward > 0 && ws.backward_peak() > 0);
    let extra = cuda.peak_allocated_bytes(batch) - tensors.peak_allocated_bytes(batch);
    // The tensors-only plan's two moments (forward: input, output; backward: the same plus the
    // gradients) differ by the gradients, so adding the scratch raises the peak by the larger
    // scratch, less at most the gradients.
    let scratch = ws.forward.max(ws.backward_peak());
    assert!(extra <= scratch, "{extra} vs {ws:?}");
    assert!(extra + tensors.grad_bytes >= scratch, "{extra} vs {ws:?}");
}

#[test]
fn a_cuda_plan_of_a_huge_sample_is_an_error_not_a_wrapped_size() {
    let conv = Conv2d::new(3, 8, 3, Conv2dConfig::default()).unwrap();
    let err = plan_on(
        &conv,
        &[3, 1 << 31, 1 << 31],
        DType::F32,
        OptimizerKind::Sgd,
        Device::Cuda(0),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("usize::MAX") || err.contains("overflow"),
        "{err}"
    );
}
