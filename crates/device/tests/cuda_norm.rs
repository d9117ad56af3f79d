//! CUDA batch norm / layer norm parity (forward, running statistics, backward)
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
