//! CUDA batch norm / layer norm parity (forward, running statistics, backward) on `CudaStorage`
//! against the CPU backend. Skips without a GPU (`cuda_device_or_skip`).
//!
//! f32/f64 run the CPU on the same dtype. f16/bf16 run the fused CUDA kernels in the 16-bit
//! dtype itself and compare with the CPU's f32 result of the same (rounded) inputs, within
//! `testing::tolerance` of the 16-bit dtype (times a margin of 4 for the few rounded steps the
//! statistics pass through). Each backward is given the statistics the CUDA forward saved
//! (widened to f32 for the CPU reference), so it is checked on identical inputs.
#![cfg(feature = "cuda")]

use kiln_device::prelude::*;
mod common;

use kiln_device::testing::{cuda_device_or_skip, tolerance};
use kiln_device::{
    BatchNormStats, CpuStorage, CudaStorage, DType, Device, GradMask, Layout, RunningStatsMut,
};

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

use common::{gpu, widened as reference};

fn values(n: usize, dtype: DType, seed: usize) -> CpuStorage {
    common::pattern(n, dtype, seed, 0.21, -2.5)
}

/// A CUDA result back on the CPU, widened like [`reference`].
fn reference_of(g: &CudaStorage) -> CpuStorage {
    reference(&g.to_cpu(&Layout::contiguous(&[g.len()])).unwrap())
}

/// `got` (of `dtype`) against the reference within the dtype's tolerance, with a margin of 4.
fn assert_near(what: &str, want: &CpuStorage, got: &CudaStorage, dtype: DType) {
    let (atol, rtol) = tolerance(dtype);
    common::assert_storage_close(what, want, got, dtype, (4.0 * atol, 4.0 * rtol));
}

#[test]
fn layer_norm_forward_and_backward_match_cpu() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    for dtype in FLOATS {
        for affine in [true, false] {
            // [2, 3, 8] normalised over the last two dims, read through a transposed view
            let x = values(48, dtype, 1);
            let xl = Layout::contiguous(&[2, 8, 3]).transpose(1, 2);
            let (w, b) = (values(24, dtype, 2), values(24, dtype, 3));
            let pl = Layout::contiguous(&[3, 8]);
            let (xr, wr, br) = (reference(&x), reference(&w), reference(&b));
            let (xg, wg, bg) = (gpu(dev, &x), gpu(dev, &w), gpu(dev, &b));
            let what = format!("layer_norm {dtype} affine={affine}");
            let pr = affine.then_some(((&wr, &pl), (&br, &pl)));
            let pg = affine.then_some(((&wg, &pl), (&bg, &pl)));
            let want = xr
                .layer_norm(&xl, 2, pr.map(|p| p.0), pr.map(|p| p.1), 1e-5)
                .unwrap();
            let got = xg
                .layer_norm(&xl, 2, pg.map(|p| p.0), pg.map(|p| p.1), 1e-5)
                .unwrap();
            for k in 0..3 {
                assert_near(&format!("{what} out {k}"), &want[k], &got[k], dtype);
            }
            let go = values(48, dtype, 4);
            let gl = Layout::contiguous(&[2, 3, 8]);
            let (gor, gog) = (reference(&go), gpu(dev, &go));
            let sl = Layout::contiguous(&[2]);
            let (mr, rr) = (reference_of(&got[1]), reference_of(&got[2]));
            let want_g = gor
                .layer_norm_backward(
                    &gl,
                    (&xr, &xl),
                    2,
                    pr.map(|p| p.0),
                    [(&mr, &sl), (&rr, &sl)],
                    GradMask::ALL,
                )
                .unwrap()
                .into_array();
            let got_g = gog
                .layer_norm_backward(
                    &gl,
                    (&xg, &xl),
                    2,
                    pg.map(|p| p.0),
                    [(&got[1], &sl), (&got[2], &sl)],
                    GradMask::ALL,
                )
                .unwrap()
                .into_array();
            for k in 0..3 {
                assert_near(
                    &format!("{what} grad {k}"),
                    want_g[k].as_ref().unwrap(),
                    got_g[k].as_ref().unwrap(),
                    dtype,
                );
            }
        }
    }
}

#[test]
fn batch_norm_train_eval_and_backward_match_cpu() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    // [N, C, S] = [2, 3, 5] and a 4-D [3, 2, 2, 3]
    for dtype in FLOATS {
        for shape in [vec![2, 3, 5], vec![3, 2, 2, 3]] {
            let (n, c): (usize, usize) = (shape.iter().product(), shape[1]);
            let x = values(n, dtype, 5);
            let xl = Layout::contiguous(&shape);
            let (w, b) = (values(c, dtype, 6), values(c, dtype, 7));
            let cl = Layout::contiguous(&[c]);
            let (xr, wr, br) = (reference(&x), reference(&w), reference(&b));
            let (xg, wg, bg) = (gpu(dev, &x), gpu(dev, &w), gpu(dev, &b));
            let rm0 = values(c, dtype, 8);
            let rv0 = CpuStorage::full(Device::Cpu, c, 1.5, dtype).unwrap();
            let (mut rm, mut rv) = (reference(&rm0), reference(&rv0));
            let (mut rmg, mut rvg) = (gpu(dev, &rm0), gpu(dev, &rv0));
            let what = format!("batch_norm {dtype} {shape:?}");
            let want = xr
                .batch_norm_train(
                    &xl,
                    Some((&wr, &cl)),
                    Some((&br, &cl)),
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
                assert_near(&format!("{what} out {k}"), &want[k], &got[k], dtype);
            }
            assert_near(&format!("{what} running mean"), &rm, &rmg, dtype);
            assert_near(&format!("{what} running var"), &rv, &rvg, dtype);
            // evaluation on the initial running statistics, with and without affine
            let (rm0r, rv0r, rm0g, rv0g) = (
                reference(&rm0),
                reference(&rv0),
                gpu(dev, &rm0),
                gpu(dev, &rv0),
            );
            for affine in [true, false] {
                let want_e = xr
                    .batch_norm_eval(
                        &xl,
                        affine.then_some((&wr, &cl)),
                        affine.then_some((&br, &cl)),
                        (&rm0r, &cl),
                        (&rv0r, &cl),
                        1e-5,
                    )
                    .unwrap();
                let got_e = xg
                    .batch_norm_eval(
                        &xl,
                        affine.then_some((&wg, &cl)),
                        affine.then_some((&bg, &cl)),
                        (&rm0g, &cl),
                        (&rv0g, &cl),
                        1e-5,
                    )
                    .unwrap();
                assert_near(
                    &format!("{what} eval affine={affine}"),
                    &want_e,
                    &got_e,
                    dtype,
                );
            }
            let go = values(n, dtype, 9);
            let (gor, gog) = (reference(&go), gpu(dev, &go));
            let (mr, rr) = (reference_of(&got[1]), reference_of(&got[2]));
            let stats_c = [
                BatchNormStats::Batch {
                    mean: (&mr, &cl),
                    rstd: (&rr, &cl),
                },
                BatchNormStats::Running {
                    mean: (&rm0r, &cl),
                    var: (&rv0r, &cl),
                    eps: 1e-5,
                },
            ];
            let stats_g = [
                BatchNormStats::Batch {
                    mean: (&got[1], &cl),
                    rstd: (&got[2], &cl),
                },
                BatchNormStats::Running {
                    mean: (&rm0g, &cl),
                    var: (&rv0g, &cl),
                    eps: 1e-5,
                },
            ];
            for (mode, (sc, sg)) in ["batch", "running"]
                .into_iter()
                .zip(stats_c.into_iter().zip(stats_g))
            {
                let want_g = gor
                    .batch_norm_backward(&xl, (&xr, &xl), Some((&wr, &cl)), sc, GradMask::ALL)
                    .unwrap()
                    .into_array();
                let got_g = gog
                    .batch_norm_backward(&xl, (&xg, &xl), Some((&wg, &cl)), sg, GradMask::ALL)
                    .unwrap()
                    .into_array();
                for k in 0..3 {
                    assert_near(
                        &format!("{what} backward ({mode} stats) grad {k}"),
                        want_g[k].as_ref().unwrap(),
                        got_g[k].as_ref().unwrap(),
                        dtype,
                    );
                }
            }
        }
    }
}

/// PyTorch's mixed case (what autocast produces): an F16/BF16 input with F32 weight, bias and
/// running statistics. CUDA's output and input gradient have the input's dtype; the saved
/// statistics, running statistics and weight/bias gradients are F32; each matches the CPU
/// backend's mixed path on the same operands.
#[test]
fn batch_norm_half_input_with_f32_vectors_matches_cpu() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    let shape = [3, 4, 2, 5];
    let (n, c) = (shape.iter().product::<usize>(), shape[1]);
    let xl = Layout::contiguous(&shape);
    let cl = Layout::contiguous(&[c]);
    for dtype in [DType::F16, DType::BF16] {
        let what = format!("mixed batch_norm {dtype}");
        let x = values(n, dtype, 11);
        let (w, b) = (values(c, DType::F32, 12), values(c, DType::F32, 13));
        let rm0 = values(c, DType::F32, 14);
        let rv0 = CpuStorage::full(Device::Cpu, c, 1.5, DType::F32).unwrap();
        let (xg, wg, bg) = (gpu(dev, &x), gpu(dev, &w), gpu(dev, &b));
        let (mut rm, mut rv) = (rm0.clone(), rv0.clone());
        let (mut rmg, mut rvg) = (gpu(dev, &rm0), gpu(dev, &rv0));
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
        assert_eq!(want[0].dtype(), dtype, "{what}: cpu output dtype");
        assert_near(&format!("{what} out"), &want[0], &got[0], dtype);
        assert_near(&format!("{what} save_mean"), &want[1], &got[1], DType::F32);
        assert_near(&format!("{what} save_rstd"), &want[2], &got[2], DType::F32);
        assert_near(&format!("{what} running mean"), &rm, &rmg, DType::F32);
        assert_near(&format!("{what} running var"), &rv, &rvg, DType::F32);
        let want_e = x
            .batch_norm_eval(
                &xl,
                Some((&w, &cl)),
                Some((&b, &cl)),
                (&rm0, &cl),
                (&rv0, &cl),
                1e-5,
            )
            .unwrap();
        let (rm0g, rv0g) = (gpu(dev, &rm0), gpu(dev, &rv0));
        let got_e = xg
            .batch_norm_eval(
                &xl,
                Some((&wg, &cl)),
                Some((&bg, &cl)),
                (&rm0g, &cl),
                (&rv0g, &cl),
                1e-5,
            )
            .unwrap();
        assert_near(&format!("{what} eval"), &want_e, &got_e, dtype);
        // backward from the statistics the CUDA forward saved (F32), in both modes
        let go = values(n, dtype, 15);
        let gog = gpu(dev, &go);
        let saved = [got[1].to_cpu(&cl).unwrap(), got[2].to_cpu(&cl).unwrap()];
        for training in [true, false] {
            let (sc, sg) = if training {
                (
                    BatchNormStats::Batch {
                        mean: (&saved[0], &cl),
                        rstd: (&saved[1], &cl),
                    },
                    BatchNormStats::Batch {
                        mean: (&got[1], &cl),
                        rstd: (&got[2], &cl),
                    },
                )
            } else {
                (
                    BatchNormStats::Running {
                        mean: (&rm0, &cl),
                        var: (&rv0, &cl),
                        eps: 1e-5,
                    },
                    BatchNormStats::Running {
                        mean: (&rm0g, &cl),
                        var: (&rv0g, &cl),
                        eps: 1e-5,
                    },
                )
            };
            let want_g = go
                .batch_norm_backward(&xl, (&x, &xl), Some((&w, &cl)), sc, GradMask::ALL)
                .unwrap()
                .into_array();
            let got_g = gog
                .batch_norm_backward(&xl, (&xg, &xl), Some((&wg, &cl)), sg, GradMask::ALL)
                .unwrap()
                .into_array();
            for (k, dt) in [dtype, DType::F32, DType::F32].into_iter().enumerate() {
                assert_near(
                    &format!("{what} backward (training={training}) grad {k}"),
                    want_g[k].as_ref().unwrap(),
                    got_g[k].as_ref().unwrap(),
                    dt,
                );
            }
        }
    }
}
