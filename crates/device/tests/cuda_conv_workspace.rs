//! `cuda_conv2d_workspace` against the CUDA convolution itself: for each pass (forward, input
//! gradient, weight gradient), the caching allocator's peak above what was allocated before,
//! less the pass's result, must equal the predicted scratch byte for byte. This is what keeps
//! the training memory plan's figure for CUDA convolutions true when the kernels change. Each
//! case runs with the whole batch unfolded at once, two images at a time and one at a time (the
//! column budget), and the chunked results must equal the whole batch's within rounding.
//!
//! One test in this binary, so nothing else allocates on the device while it counts bytes, and
//! nothing else runs a convolution while it changes the process-wide column budget.
//! Without a usable device it prints why and passes (fails with `KILN_REQUIRE_CUDA=1`).
#![cfg(feature = "cuda")]

mod common;

use common::gpu;
use kiln_device::ops::conv::{
    cuda_conv2d_workspace, cuda_conv_column_budget, cuda_conv_images_per_chunk,
    set_cuda_conv_column_budget, Conv2dGeometry, Conv2dParams, DEFAULT_CUDA_CONV_COLUMN_BUDGET,
};
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

/// One pass's outputs on the host: the forward output, then the input and weight gradients.
type Results = [Vec<f64>; 3];

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
    let default_budget = cuda_conv_column_budget();
    assert_eq!(default_budget, DEFAULT_CUDA_CONV_COLUMN_BUDGET);
    assert!(
        set_cuda_conv_column_budget(0).is_err(),
        "a zero budget is refused"
    );
    for dtype in [DType::F32, DType::F16] {
        for (xs, ws, params, has_bias) in cases {
            let g = Conv2dGeometry::new(xs, ws, params).unwrap();
            let per_image = ws[1]
                * params.groups
                * ws[2]
                * ws[3]
                * g.output_size[0]
                * g.output_size[1]
                * dtype.size_in_bytes();
            // The whole batch at once (the default budget holds it), two images at a time
            // (the odd batches end on a one-image chunk), one at a time.
            let mut whole: Option<Results> = None;
            for (per_chunk, budget) in [(xs[0], default_budget), (2, 2 * per_image), (1, 1)] {
                set_cuda_conv_column_budget(budget).unwrap();
                assert_eq!(
                    cuda_conv_images_per_chunk(&g, dtype).unwrap(),
                    per_chunk.min(xs[0])
                );
                let results = check_case(dev, dtype, (xs, ws, params, has_bias), &g, per_chunk);
                match &whole {
                    None => whole = Some(results),
                    Some(want) => {
                        // Chunks run the same per-image GEMMs for the output and the column
                        // gradient (equal bits on the emulator; cuBLAS may pick another
                        // algorithm for another batch count); the weight gradient sums the
                        // chunks in another order. Within rounding relative to the largest
                        // value: an image missed or counted twice differs by its whole share.
                        let what = format!("{dtype} {xs:?} {ws:?} in chunks of {per_chunk}");
                        let (atol, rtol) = kiln_device::testing::tolerance(dtype);
                        for (k, name) in ["output", "input gradient", "weight gradient"]
                            .into_iter()
                            .enumerate()
                        {
                            let largest = want[k].iter().fold(0f64, |m, v| m.max(v.abs()));
                            kiln_testkit::assert_close(
                                &format!("{what}: {name}"),
                                &results[k],
                                &want[k],
                                (atol.max(largest * rtol), rtol),
                            );
                        }
                    }
                }
            }
        }
    }
    set_cuda_conv_column_budget(default_budget).unwrap();
}

/// Runs each pass of one case, checks its scratch against the prediction, and returns what it
/// computed.
fn check_case(
    dev: Device,
    dtype: DType,
    (xs, ws, params, has_bias): ([usize; 4], [usize; 4], Conv2dParams, bool),
    g: &Conv2dGeometry,
    per_chunk: usize,
) -> Results {
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
    let what = format!("{dtype} {xs:?} {ws:?} {params:?} bias={has_bias} chunk={per_chunk}");
    // A first run of each pass creates whatever the device keeps (library handles).
    drop(x.conv2d(&xl, (&w, &wl), bias, g).unwrap());
    drop(go.conv2d_backward(&ol, (&x, &xl), (&w, &wl), g, GradMask::ALL));

    let forward = scratch_of(
        dev,
        || x.conv2d(&xl, (&w, &wl), bias, g).unwrap(),
        |_: &CudaStorage| block(numel(&out), dtype),
    );
    let only = |input, weight| GradMask {
        input,
        weight,
        bias: false,
    };
    let backward = |mask: GradMask, result_bytes: usize| {
        scratch_of(
            dev,
            || {
                go.conv2d_backward(&ol, (&x, &xl), (&w, &wl), g, mask)
                    .unwrap()
            },
            |_| result_bytes,
        )
    };
    let input = backward(only(true, false), block(numel(&xs), dtype));
    let weight = backward(only(false, true), block(numel(&ws), dtype));
    let predicted = |mask| cuda_conv2d_workspace(g, dtype, mask).unwrap();
    assert_eq!(
        forward,
        predicted(only(true, true)).forward,
        "{what}: forward"
    );
    let input_peak = predicted(only(true, false)).backward_peak();
    assert_eq!(input, input_peak, "{what}: input gradient");
    let weight_peak = predicted(only(false, true)).backward_peak();
    assert_eq!(weight, weight_peak, "{what}: weight gradient");
    assert_eq!(
        predicted(GradMask::ALL).batch_limit.min(xs[0]),
        per_chunk.min(xs[0]),
        "{what}: batch limit"
    );
    println!("{what}: forward {forward} B, input grad {input} B, weight grad {weight} B");
    let y = x.conv2d(&xl, (&w, &wl), bias, g).unwrap();
    let all = go
        .conv2d_backward(&ol, (&x, &xl), (&w, &wl), g, only(true, true))
        .unwrap();
    let host = |s: &CudaStorage| kiln_device::testing::host_f64(s).unwrap();
    [
        host(&y),
        host(all.input.as_ref().unwrap()),
        host(all.weight.as_ref().unwrap()),
    ]
}
