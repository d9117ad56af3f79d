//! `cuda_conv2d_workspace` against the CUDA convolution itself: for each pass (forward, input
//! gradient, weight gradient), the caching allocator's peak above what was allocated before,
//! less the pass's result, must equal the predicted scratch byte for byte. This is what keeps
//! the training memory plan's figure for CUDA convolutions true when the kernels change.
//!
//! One test in this binary, so nothing else allocates on the device while it counts bytes.
//! Without a usable device it prints why and passes (fails with `KILN_REQUIRE_CUDA=1`).
#![cfg(feature = "cuda")]

mod common;

use common::gpu;
use kiln_device::ops::conv::{cuda_conv2d_workspace, Conv2dGeometry, Conv2dParams};
use kiln_device::prelude::*;
use kiln_device::testing::cuda_device_or_skip;
use kiln_device::{
    max_memory_allocated, memory_allocated, reset_peak_memory_stats, CudaStorage, DType, Device,
    GradMask, Layout,
};

/// Bytes the allocator hands out for `numel` elements of `dtype`.
fn block(numel: usize, dtype: DType) -> usize {
    (numel * dtype.size_in_bytes()).div_ceil(512) * 512
}

/// Peak of allocated bytes above the current level while `f` runs, less the bytes of what it
/// returns (still alive when the peak is read).
fn scratch_of<R>(dev: Device, f: impl FnOnce() -> R, result_bytes: impl Fn(&R) -> usize) -> usize {
    let before = memory_allocated(dev).unwrap();
    reset_peak_memory_stats(dev).unwrap();
    let r = f();
    let peak = max_memory_allocated(dev).unwrap() - before;
    peak - result_bytes(&r)
}

#[test]
fn each_pass_allocates_exactly_the_predicted_scratch() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    let p = |stride, padding, groups| Conv2dParams {
        stride,
        padding,
        dilation: [1, 1],
        groups,
    };
    let cases = [
        // (input, weight, params, bias): ResNet's 3x3, a strided 3x3 with bias, grouped, 1x1
        ([4, 16, 12, 12], [16, 16, 3, 3], p([1, 1], [1, 1], 1), false),
        ([3, 8, 15, 13], [12, 8, 3, 3], p([2, 2], [1, 1], 1), true),
        ([2, 12, 9, 9], [6, 4, 3, 3], p([1, 1], [1, 1], 3), true),
        (
            [5, 32, 7, 7],
            [64, 32, 1, 1],
            Conv2dParams::default(),
            false,
        ),
    ];
    for dtype in [DType::F32, DType::F16] {
        for (xs, ws, params, has_bias) in cases {
            let g = Conv2dGeometry::new(xs, ws, params).unwrap();
            let numel = |s: &[usize]| s.iter().product::<usize>();
            let values = |n, seed| common::pattern(n, dtype, seed, 0.13, -1.5);
            let (x, w, b) = (
                gpu(dev, &values(numel(&xs), 1)),
                gpu(dev, &values(numel(&ws), 2)),
                gpu(dev, &values(ws[0], 3)),
            );
            let (xl, wl, bl) = (
                Layout::contiguous(&xs),
                Layout::contiguous(&ws),
                Layout::contiguous(&[ws[0]]),
            );
            let bias = has_bias.then_some((&b, &bl));
            let out = g.output_shape();
            let go = gpu(dev, &values(numel(&out), 4));
            let ol = Layout::contiguous(&out);
            let what = format!("{dtype} {xs:?} {ws:?} {params:?} bias={has_bias}");
            // A first run of each pass creates whatever the device keeps (library handles).
            drop(x.conv2d(&xl, (&w, &wl), bias, &g).unwrap());
            drop(go.conv2d_backward(&ol, (&x, &xl), (&w, &wl), &g, GradMask::ALL));

            let forward = scratch_of(
                dev,
                || x.conv2d(&xl, (&w, &wl), bias, &g).unwrap(),
                |_: &CudaStorage| block(numel(&out), dtype),
            );
            let backward = |mask: GradMask| {
                scratch_of(
                    dev,
                    || {
                        go.conv2d_backward(&ol, (&x, &xl), (&w, &wl), &g, mask)
                            .unwrap()
                    },
                    |_| {
                        let mut bytes = 0;
                        if mask.input {
                            bytes += block(numel(&xs), dtype);
                        }
                        if mask.weight {
                            bytes += block(numel(&ws), dtype);
                        }
                        bytes
                    },
                )
            };
            let only = |input, weight| GradMask {
                input,
                weight,
                bias: false,
            };
            let (input, weight) = (backward(only(true, false)), backward(only(false, true)));
            let predicted = |mask| cuda_conv2d_workspace(&g, dtype, mask).unwrap();
            assert_eq!(
                forward,
                predicted(only(true, true)).forward,
                "{what}: forward"
            );
            let input_peak = predicted(only(true, false)).backward_peak();
            assert_eq!(input, input_peak, "{what}: input gradient");
            let weight_peak = predicted(only(false, true)).backward_peak();
            assert_eq!(weight, weight_peak, "{what}: weight gradient");
            println!("{what}: forward {forward} B, input grad {input} B, weight grad {weight} B");
        }
    }
}
