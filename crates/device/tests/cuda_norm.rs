//! CUDA batch norm / layer norm / conv2d / pooling parity (forward, running statistics, backward)
//! on `CudaStorage` against the CPU backend. Skips without a GPU (`cuda_device_or_skip`).
#![cfg(feature = "cuda")]

use kiln_device::testing::{close, cuda_device_or_skip, tolerance};
use kiln_device::{
    BackendStorage, BatchNormStats, CpuStorage, CudaStorage, DType, Device, Layout, RunningStatsMut,
};

fn values(n: usize, dtype: DType, seed: usize) -> CpuStorage {
    let v: Vec<f64> = (0..n)
        .map(|i| ((i * 37 + seed * 11) % 29) as f64 * 0.21 - 2.5)
        .collect();
    CpuStorage::from_vec(v)
        .to_dtype(&Layout::contiguous(&[n]), dtype)
        .unwrap()
}

fn gpu(dev: Device, c: &CpuStorage) -> CudaStorage {
    CudaStorage::from_cpu(dev, c).unwrap()
}

fn assert_match(what: &str, want: &CpuStorage, got: &CudaStorage) {
    assert_eq!(want.dtype(), got.dtype(), "{what}: dtype");
    let g = got
        .to_cpu(&Layout::contiguous(&[got.len()]))
        .unwrap()
        .to_f64_vec();
    let w = want.to_f64_vec();
    assert_eq!(g.len(), w.len(), "{what}: length");
    // statistics pass through a few rounded steps: allow a few units of the dtype's tolerance
    let (atol, rtol) = tolerance(want.dtype());
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!(
            close(*a, *b, (4.0 * atol, 4.0 * rtol)),
            "{what}[{i}]: cuda {a} vs cpu {b}"
        );
    }
}

#[test]
fn layer_norm_forward_and_backward_match_cpu() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        // [2, 3, 8] normalised over the last two dims, read through a transposed view
        let x = values(48, dtype, 1);
        let xl = Layout::contiguous(&[2, 8, 3]).transpose(1, 2);
        let (w, b) = (values(24, dtype, 2), values(24, dtype, 3));
        let pl = Layout::contiguous(&[3, 8]);
        let (xg, wg, bg) = (gpu(dev, &x), gpu(dev, &w), gpu(dev, &b));
        let want = x
            .layer_norm(&xl, 2, Some((&w, &pl)), Some((&b, &pl)), 1e-5)
            .unwrap();
        let got = xg
            .layer_norm(&xl, 2, Some((&wg, &pl)), Some((&bg, &pl)), 1e-5)
            .unwrap();
        for k in 0..3 {
            assert_match(&format!("layer_norm {dtype} out {k}"), &want[k], &got[k]);
        }
        let go = values(48, dtype, 4);
        let gl = Layout::contiguous(&[2, 3, 8]);
        let gog = gpu(dev, &go);
        let sl = Layout::contiguous(&[2]);
        let want_g = go
            .layer_norm_backward(
                &gl,
                (&x, &xl),
                2,
                Some((&w, &pl)),
                [(&want[1], &sl), (&want[2], &sl)],
                [true; 3],
            )
            .unwrap();
        let got_g = gog
            .layer_norm_backward(
                &gl,
                (&xg, &xl),
                2,
                Some((&wg, &pl)),
                [(&got[1], &sl), (&got[2], &sl)],
                [true; 3],
            )
            .unwrap();
        for k in 0..3 {
            assert_match(
                &format!("layer_norm_backward {dtype} grad {k}"),
                want_g[k].as_ref().unwrap(),
                got_g[k].as_ref().unwrap(),
            );
        }
    }
}

#[test]
fn batch_norm_train_eval_and_backward_match_cpu() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        let x = values(2 * 3 * 5, dtype, 5);
        let xl = Layout::contiguous(&[2, 3, 5]);
        let (w, b) = (values(3, dtype, 6), values(3, dtype, 7));
        let cl = Layout::contiguous(&[3]);
        let (xg, wg, bg) = (gpu(dev, &x), gpu(dev, &w), gpu(dev, &b));
        let (mut rm, mut rv) = (
            values(3, dtype, 8),
            CpuStorage::full(Device::Cpu, 3, 1.5, dtype).unwrap(),
        );
        let (mut rmg, mut rvg) = (gpu(dev, &rm), gpu(dev, &rv));
        let want = x
            .batch_norm_train(
                &xl,
                Some((&w, &cl)),
                Some((&b, &cl)),
                Some(RunningStatsMut {
                    mean: (&mut rm, &cl),
                    var: (&mut rv, &cl),
                    momentum: 0.1,
                }),
                1e-5,
            )
            .unwrap();
        let got = xg
            .batch_norm_train(
                &xl,
                Some((&wg, &cl)),
                Some((&bg, &cl)),
                Some(RunningStatsMut {
                    mean: (&mut rmg, &cl),
                    var: (&mut rvg, &cl),
                    momentum: 0.1,
                }),
                1e-5,
            )
            .unwrap();
        for k in 0..3 {
            assert_match(&format!("batch_norm {dtype} out {k}"), &want[k], &got[k]);
        }
        assert_match(&format!("running mean {dtype}"), &rm, &rmg);
        assert_match(&format!("running var {dtype}"), &rv, &rvg);
        assert_match(
            &format!("batch_norm eval {dtype}"),
            &x.batch_norm_eval(
                &xl,
                Some((&w, &cl)),
                Some((&b, &cl)),
                (&rm, &cl),
                (&rv, &cl),
                1e-5,
            )
            .unwrap(),
            &xg.batch_norm_eval(
                &xl,
                Some((&wg, &cl)),
                Some((&bg, &cl)),
                (&rmg, &cl),
                (&rvg, &cl),
                1e-5,
            )
            .unwrap(),
        );
        let go = values(30, dtype, 9);
        let gog = gpu(dev, &go);
        let stats_c = [
            BatchNormStats::Batch {
                mean: (&want[1], &cl),
                rstd: (&want[2], &cl),
            },
            BatchNormStats::Running {
                mean: (&rm, &cl),
                var: (&rv, &cl),
                eps: 1e-5,
            },
        ];
        let stats_g = [
            BatchNormStats::Batch {
                mean: (&got[1], &cl),
                rstd: (&got[2], &cl),
            },
            BatchNormStats::Running {
                mean: (&rmg, &cl),
                var: (&rvg, &cl),
                eps: 1e-5,
            },
        ];
        for (sc, sg) in stats_c.into_iter().zip(stats_g) {
            let want_g = go
                .batch_norm_backward(&xl, (&x, &xl), Some((&w, &cl)), sc, [true; 3])
                .unwrap();
            let got_g = gog
                .batch_norm_backward(&xl, (&xg, &xl), Some((&wg, &cl)), sg, [true; 3])
                .unwrap();
            for k in 0..3 {
                assert_match(
                    &format!("batch_norm_backward {dtype} grad {k}"),
                    want_g[k].as_ref().unwrap(),
                    got_g[k].as_ref().unwrap(),
                );
            }
        }
    }
}

#[test]
fn conv2d_forward_and_backward_match_cpu() {
    use kiln_device::ops::conv::{Conv2dGeometry, Conv2dParams};
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    let cases = [
        // (input [N, C, H, W], weight [C_out, C_in/g, kH, kW], params)
        ([2, 3, 7, 6], [4, 3, 3, 3], Conv2dParams::default()),
        (
            [2, 4, 9, 8],
            [6, 2, 3, 2],
            Conv2dParams {
                stride: [2, 1],
                padding: [1, 2],
                dilation: [2, 1],
                groups: 2,
            },
        ),
        ([1, 2, 5, 5], [3, 2, 1, 1], Conv2dParams::default()),
    ];
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        for (xs, ws, params) in cases {
            let g = Conv2dGeometry::new(xs, ws, params).unwrap();
            let (xn, wn): (usize, usize) = (xs.iter().product(), ws.iter().product());
            let (x, w, b) = (
                values(xn, dtype, 1),
                values(wn, dtype, 2),
                values(ws[0], dtype, 3),
            );
            let (xl, wl, bl) = (
                Layout::contiguous(&xs),
                Layout::contiguous(&ws),
                Layout::contiguous(&[ws[0]]),
            );
            let (xg, wg, bg) = (gpu(dev, &x), gpu(dev, &w), gpu(dev, &b));
            let what = format!("conv2d {dtype} {xs:?} {ws:?}");
            let want = x.conv2d(&xl, (&w, &wl), Some((&b, &bl)), &g).unwrap();
            let got = xg.conv2d(&xl, (&wg, &wl), Some((&bg, &bl)), &g).unwrap();
            assert_match(&what, &want, &got);
            let on: usize = g.output_shape().iter().product();
            let go = values(on, dtype, 4);
            let ol = Layout::contiguous(&g.output_shape());
            let gog = gpu(dev, &go);
            let want_g = go
                .conv2d_backward(&ol, (&x, &xl), (&w, &wl), &g, [true; 3])
                .unwrap();
            let got_g = gog
                .conv2d_backward(&ol, (&xg, &xl), (&wg, &wl), &g, [true; 3])
                .unwrap();
            for k in 0..3 {
                assert_match(
                    &format!("{what} grad {k}"),
                    want_g[k].as_ref().unwrap(),
                    got_g[k].as_ref().unwrap(),
                );
            }
        }
    }
}

#[test]
fn pooling_forward_and_backward_match_cpu() {
    use kiln_device::ops::pool::{
        AdaptiveAvgPool2dGeometry, AvgPool2dGeometry, AvgPool2dParams, MaxPool2dGeometry,
        MaxPool2dParams,
    };
    use kiln_device::Pool2d;
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    let xs = [2, 3, 9, 8];
    let mut maxp = MaxPool2dParams::new([3, 2]);
    maxp.stride = [2, 2];
    maxp.padding = [1, 1];
    maxp.dilation = [1, 2];
    maxp.ceil_mode = true;
    let mut avgp = AvgPool2dParams::new([3, 3]);
    avgp.stride = [2, 1];
    avgp.padding = [1, 1];
    avgp.count_include_pad = false;
    let mut avg_div = AvgPool2dParams::new([2, 2]);
    avg_div.divisor_override = Some(3);
    let pools = [
        Pool2d::Max(MaxPool2dGeometry::new(xs, maxp).unwrap()),
        Pool2d::Avg(AvgPool2dGeometry::new(xs, avgp).unwrap()),
        Pool2d::Avg(AvgPool2dGeometry::new(xs, avg_div).unwrap()),
        Pool2d::AdaptiveAvg(AdaptiveAvgPool2dGeometry::new(xs, [4, 3]).unwrap()),
    ];
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        let n: usize = xs.iter().product();
        let x = values(n, dtype, 1);
        let xl = Layout::contiguous(&xs);
        let xg = gpu(dev, &x);
        for pool in &pools {
            let what = format!("{dtype} {pool:?}");
            let (want, want_idx) = x.pool2d(&xl, pool).unwrap();
            let (got, got_idx) = xg.pool2d(&xl, pool).unwrap();
            assert_match(&what, &want, &got);
            if let (Some(wi), Some(gi)) = (&want_idx, &got_idx) {
                assert_match(&format!("{what} indices"), wi, gi);
            }
            let os: Vec<usize> = match pool {
                Pool2d::Max(g) => g.shape.output_shape().to_vec(),
                Pool2d::Avg(g) => g.shape.output_shape().to_vec(),
                Pool2d::AdaptiveAvg(g) => g.shape.output_shape().to_vec(),
            };
            let ol = Layout::contiguous(&os);
            let go = values(want.len(), dtype, 2);
            let gog = gpu(dev, &go);
            let want_g = go
                .pool2d_backward(&ol, want_idx.as_ref().map(|i| (i, &ol)), pool)
                .unwrap();
            let got_g = gog
                .pool2d_backward(&ol, got_idx.as_ref().map(|i| (i, &ol)), pool)
                .unwrap();
            assert_match(&format!("{what} backward"), &want_g, &got_g);
        }
    }
}
