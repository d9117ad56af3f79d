//! CUDA conv2d and pooling parity, forward and backward, on `CudaStorage` against the CPU
//! backend. Skips without a GPU (`cuda_device_or_skip`).
//!
//! f32/f64 run the CPU on the same dtype. f16/bf16 run the CUDA kernels in the 16-bit dtype
//! itself and compare with the CPU's f32 result of the same (rounded) inputs, so the reference
//! is unrounded: conv2d with `testing::sum_tolerance` (see its doc and `ops/conv/cuda.rs` for
//! why the length of the reduction enters), pooling with `testing::tolerance`. Max-pool indices
//! must match exactly (widening to f32 is exact, so the f32 argmax is the 16-bit one).
#![cfg(feature = "cuda")]

mod common;

use kiln_device::ops::conv::{Conv2dGeometry, Conv2dParams};
use kiln_device::ops::pool::{
    AdaptiveAvgPool2dGeometry, AvgPool2dGeometry, AvgPool2dParams, MaxPool2dGeometry,
    MaxPool2dParams,
};
use kiln_device::prelude::*;
use kiln_device::testing::{cuda_device_or_skip, sum_tolerance, tolerance};
use kiln_device::GradMask;
use kiln_device::{CpuStorage, CudaStorage, DType, Layout, Pool2d};

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

use common::{gpu, widened as reference_input};

fn values(n: usize, dtype: DType, seed: usize) -> CpuStorage {
    common::pattern(n, dtype, seed, 0.21, -2.5)
}

/// `got` (of `dtype`) against the reference within `tol`, with the margin of a few rounded steps.
fn assert_near(what: &str, want: &CpuStorage, got: &CudaStorage, dtype: DType, tol: (f64, f64)) {
    common::assert_storage_close(what, want, got, dtype, (4.0 * tol.0, 4.0 * tol.1));
}

#[test]
fn conv2d_forward_and_backward_match_cpu_in_every_float_dtype() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    let p = |stride, padding, dilation, groups| Conv2dParams {
        stride,
        padding,
        dilation,
        groups,
    };
    let cases = [
        // (input [N, C, H, W], weight [C_out, C_in/g, kH, kW], params, transposed input view)
        ([2, 3, 7, 6], [4, 3, 3, 3], Conv2dParams::default(), false),
        (
            [2, 3, 7, 6],
            [4, 3, 3, 3],
            p([1, 1], [1, 1], [1, 1], 1),
            true,
        ),
        (
            [2, 4, 9, 8],
            [6, 2, 3, 2],
            p([2, 1], [1, 2], [2, 1], 2),
            false,
        ),
        (
            [2, 4, 6, 6],
            [4, 1, 3, 3],
            p([2, 2], [1, 1], [1, 1], 4),
            false,
        ),
        ([1, 2, 5, 5], [3, 2, 1, 1], Conv2dParams::default(), false),
        // An empty batch: empty output and input gradient, zero weight and bias gradients.
        (
            [0, 3, 7, 6],
            [4, 3, 3, 3],
            p([1, 1], [1, 1], [1, 1], 1),
            false,
        ),
    ];
    for dtype in FLOATS {
        for (xs, ws, params, transposed) in cases {
            let g = Conv2dGeometry::new(xs, ws, params).unwrap();
            let (xn, wn): (usize, usize) = (xs.iter().product(), ws.iter().product());
            let (x, w, b) = (
                values(xn, dtype, 1),
                values(wn, dtype, 2),
                values(ws[0], dtype, 3),
            );
            let xl = if transposed {
                // the same [N, C, H, W] read from a [N, C, W, H] buffer
                Layout::contiguous(&[xs[0], xs[1], xs[3], xs[2]]).transpose(2, 3)
            } else {
                Layout::contiguous(&xs)
            };
            let (wl, bl) = (Layout::contiguous(&ws), Layout::contiguous(&[ws[0]]));
            let (xr, wr, br) = (
                reference_input(&x),
                reference_input(&w),
                reference_input(&b),
            );
            let (xg, wg, bg) = (gpu(dev, &x), gpu(dev, &w), gpu(dev, &b));
            let what = format!("conv2d {dtype} {xs:?} {ws:?} {params:?} transposed={transposed}");
            let k_fwd = ws[1] * ws[2] * ws[3];
            let k_dx = ws[0] / params.groups * ws[2] * ws[3];
            let want = xr.conv2d(&xl, (&wr, &wl), Some((&br, &bl)), &g).unwrap();
            let got = xg.conv2d(&xl, (&wg, &wl), Some((&bg, &bl)), &g).unwrap();
            assert_near(&what, &want, &got, dtype, sum_tolerance(dtype, k_fwd));
            let on: usize = g.output_shape().iter().product();
            let go = values(on, dtype, 4);
            let ol = Layout::contiguous(&g.output_shape());
            let (gor, gog) = (reference_input(&go), gpu(dev, &go));
            let want_g = gor
                .conv2d_backward(&ol, (&xr, &xl), (&wr, &wl), &g, GradMask::ALL)
                .unwrap()
                .into_array();
            let got_g = gog
                .conv2d_backward(&ol, (&xg, &xl), (&wg, &wl), &g, GradMask::ALL)
                .unwrap()
                .into_array();
            for (k, terms) in [(0, k_dx), (1, 1), (2, 1)] {
                assert_near(
                    &format!("{what} grad {k}"),
                    want_g[k].as_ref().unwrap(),
                    got_g[k].as_ref().unwrap(),
                    dtype,
                    sum_tolerance(dtype, terms),
                );
            }
        }
    }
}

#[test]
fn pooling_forward_and_backward_match_cpu_in_every_float_dtype() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    let xs = [2, 3, 9, 8];
    let mut maxp = MaxPool2dParams::new([3, 2]);
    maxp.stride = [2, 2];
    maxp.padding = [1, 1];
    maxp.dilation = [1, 2];
    maxp.ceil_mode = true;
    let mut max_overlap = MaxPool2dParams::new([3, 3]);
    max_overlap.stride = [1, 2];
    max_overlap.padding = [1, 0];
    let mut avgp = AvgPool2dParams::new([3, 3]);
    avgp.stride = [2, 1];
    avgp.padding = [1, 1];
    avgp.count_include_pad = false;
    let mut avg_pad = AvgPool2dParams::new([3, 2]);
    avg_pad.stride = [2, 2];
    avg_pad.padding = [1, 1];
    avg_pad.ceil_mode = true;
    let mut avg_div = AvgPool2dParams::new([2, 2]);
    avg_div.divisor_override = Some(3);
    let pools = [
        Pool2d::Max(MaxPool2dGeometry::new(xs, maxp).unwrap()),
        Pool2d::Max(MaxPool2dGeometry::new(xs, max_overlap).unwrap()),
        Pool2d::MaxValues(MaxPool2dGeometry::new(xs, max_overlap).unwrap()),
        Pool2d::Avg(AvgPool2dGeometry::new(xs, avgp).unwrap()),
        Pool2d::Avg(AvgPool2dGeometry::new(xs, avg_pad).unwrap()),
        Pool2d::Avg(AvgPool2dGeometry::new(xs, avg_div).unwrap()),
        Pool2d::AdaptiveAvg(AdaptiveAvgPool2dGeometry::new(xs, [4, 3]).unwrap()),
        Pool2d::AdaptiveAvg(AdaptiveAvgPool2dGeometry::new(xs, [5, 7]).unwrap()),
    ];
    for dtype in FLOATS {
        let n: usize = xs.iter().product();
        let x = values(n, dtype, 1);
        let xl = Layout::contiguous(&xs);
        let (xr, xg) = (reference_input(&x), gpu(dev, &x));
        for pool in &pools {
            let what = format!("{dtype} {pool:?}");
            let (want, want_idx) = xr.pool2d(&xl, pool).unwrap();
            let (got, got_idx) = xg.pool2d(&xl, pool).unwrap();
            assert_near(&what, &want, &got, dtype, tolerance(dtype));
            if let (Some(wi), Some(gi)) = (&want_idx, &got_idx) {
                assert_near(&format!("{what} indices"), wi, gi, DType::I64, (0.0, 0.0));
            }
            assert_eq!(want_idx.is_some(), got_idx.is_some(), "{what}");
            assert_eq!(got_idx.is_some(), matches!(pool, Pool2d::Max(_)), "{what}");
            let os: Vec<usize> = match pool {
                Pool2d::MaxValues(g) => {
                    // No indices kept, so no backward: an error on both devices.
                    let ol = Layout::contiguous(&g.shape.output_shape());
                    let go = values(want.len(), dtype, 2);
                    let (gor, gog) = (reference_input(&go), gpu(dev, &go));
                    assert!(gor.pool2d_backward(&ol, None, pool).is_err(), "{what}");
                    assert!(gog.pool2d_backward(&ol, None, pool).is_err(), "{what}");
                    continue;
                }
                Pool2d::Max(g) => g.shape.output_shape().to_vec(),
                Pool2d::Avg(g) => g.shape.output_shape().to_vec(),
                Pool2d::AdaptiveAvg(g) => g.shape.output_shape().to_vec(),
            };
            let ol = Layout::contiguous(&os);
            let go = values(want.len(), dtype, 2);
            let (gor, gog) = (reference_input(&go), gpu(dev, &go));
            let want_g = gor
                .pool2d_backward(&ol, want_idx.as_ref().map(|i| (i, &ol)), pool)
                .unwrap();
            let got_g = gog
                .pool2d_backward(&ol, got_idx.as_ref().map(|i| (i, &ol)), pool)
                .unwrap();
            assert_near(
                &format!("{what} backward"),
                &want_g,
                &got_g,
                dtype,
                tolerance(dtype),
            );
        }
    }
}
