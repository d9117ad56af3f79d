//! Normalisation kernels: PyTorch parity for batch norm (training with running statistics,
//! without them, evaluation) and layer norm, forward and backward in f64 and f32;
//! finite-difference gradient checks; errors.

mod common;

use common::*;
use kiln_device::ops::norm::{
    cpu, Affine, BatchNormShape, LayerNormShape, NormGrads, RunningStats, RunningStatsUpdate,
    SavedStats, SavedStatsMut,
};
use kiln_device::ops::{KernelError, KernelFloat};

const FIXTURE: &str = include_str!("fixtures/norm.json");

fn cast<T: KernelFloat>(v: &[f64]) -> Vec<T> {
    v.iter().map(|&x| T::from_f64(x)).collect()
}

fn widen<T: KernelFloat>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// Everything one batch-norm case produces, widened to f64.
#[derive(Default)]
struct BatchNormRun {
    output: Vec<f64>,
    save_mean: Vec<f64>,
    save_rstd: Vec<f64>,
    running_mean: Vec<f64>,
    running_var: Vec<f64>,
    grad_input: Vec<f64>,
    grad_weight: Vec<f64>,
    grad_bias: Vec<f64>,
}

fn run_batch_norm<T: KernelFloat>(case: &serde_json::Value) -> BatchNormRun {
    let input = tensor(case, "input");
    let shape = BatchNormShape::from_input_shape(&input.shape).unwrap();
    let c = shape.channels;
    let x: Vec<T> = cast(&input.data);
    let dy: Vec<T> = cast(&tensor(case, "grad_output").data);
    let opt = |key: &str| has(case, key).then(|| cast::<T>(&tensor(case, key).data));
    let (weight, bias) = (opt("weight"), opt("bias"));
    let affine = Affine {
        weight: weight.as_deref(),
        bias: bias.as_deref(),
    };
    let (mut rm, mut rv) = (opt("running_mean"), opt("running_var"));
    let eps = case["eps"].as_f64().unwrap();
    let momentum = case["momentum"].as_f64().unwrap();
    let mut out = vec![T::ZERO; x.len()];
    let (mut gin, mut gw, mut gb) = (vec![T::ZERO; x.len()], vec![T::ZERO; c], vec![T::ZERO; c]);
    let mut run = BatchNormRun::default();
    let grads = NormGrads {
        input: Some(&mut gin[..]),
        weight: weight.is_some().then_some(&mut gw[..]),
        bias: weight.is_some().then_some(&mut gb[..]),
    };
    if case["training"].as_bool().unwrap() {
        let (mut mean, mut rstd) = (vec![T::ZERO; c], vec![T::ZERO; c]);
        let running = match (rm.as_deref_mut(), rv.as_deref_mut()) {
            (Some(mean), Some(var)) => Some(RunningStatsUpdate {
                mean,
                var,
                momentum,
            }),
            _ => None,
        };
        let saved = SavedStatsMut {
            mean: &mut mean,
            rstd: &mut rstd,
        };
        cpu::batch_norm_train_forward(&shape, &x, affine, running, eps, &mut out, saved).unwrap();
        let saved = SavedStats {
            mean: &mean,
            rstd: &rstd,
        };
        cpu::batch_norm_train_backward(&shape, &dy, &x, weight.as_deref(), saved, grads).unwrap();
        run.save_mean = widen(&mean);
        run.save_rstd = widen(&rstd);
    } else {
        let running = RunningStats {
            mean: rm.as_deref().unwrap(),
            var: rv.as_deref().unwrap(),
        };
        cpu::batch_norm_eval_forward(&shape, &x, affine, running, eps, &mut out).unwrap();
        cpu::batch_norm_eval_backward(&shape, &dy, &x, weight.as_deref(), running, eps, grads)
            .unwrap();
    }
    run.output = widen(&out);
    run.running_mean = rm.as_deref().map(widen).unwrap_or_default();
    run.running_var = rv.as_deref().map(widen).unwrap_or_default();
    run.grad_input = widen(&gin);
    run.grad_weight = widen(&gw);
    run.grad_bias = widen(&gb);
    run
}

fn check_batch_norm_case(case: &serde_json::Value, run: &BatchNormRun, tol: f64, dtype: &str) {
    let name = format!("{} {dtype}", case["name"].as_str().unwrap());
    let expect = |key: &str, got: &[f64]| {
        assert_close(&format!("{name} {key}"), got, &tensor(case, key).data, tol)
    };
    expect("output", &run.output);
    expect("grad_input", &run.grad_input);
    if has(case, "save_mean") {
        expect("save_mean", &run.save_mean);
        expect("save_rstd", &run.save_rstd);
    }
    if has(case, "new_running_mean") {
        expect("new_running_mean", &run.running_mean);
        expect("new_running_var", &run.running_var);
    } else if has(case, "running_mean") {
        // Evaluation leaves the running statistics alone.
        expect("running_mean", &run.running_mean);
        expect("running_var", &run.running_var);
    }
    if has(case, "grad_weight") {
        expect("grad_weight", &run.grad_weight);
        expect("grad_bias", &run.grad_bias);
    }
}

#[test]
fn batch_norm_matches_pytorch() {
    let fixture = parse(FIXTURE);
    let all = cases(&fixture, "batch_norm");
    assert_eq!(all.len(), 4);
    for case in all {
        check_batch_norm_case(case, &run_batch_norm::<f64>(case), F64_TOL, "f64");
        check_batch_norm_case(case, &run_batch_norm::<f32>(case), 1e-4, "f32");
    }
}

fn run_layer_norm<T: KernelFloat>(case: &serde_json::Value) -> [Vec<f64>; 6] {
    let input = tensor(case, "input");
    let normalized: Vec<usize> = case["normalized_shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    let shape = LayerNormShape::new(&input.shape, &normalized).unwrap();
    let x: Vec<T> = cast(&input.data);
    let dy: Vec<T> = cast(&tensor(case, "grad_output").data);
    let opt = |key: &str| has(case, key).then(|| cast::<T>(&tensor(case, key).data));
    let (weight, bias) = (opt("weight"), opt("bias"));
    let eps = case["eps"].as_f64().unwrap();
    let mut out = vec![T::ZERO; x.len()];
    let (mut mean, mut rstd) = (vec![T::ZERO; shape.rows], vec![T::ZERO; shape.rows]);
    let affine = Affine {
        weight: weight.as_deref(),
        bias: bias.as_deref(),
    };
    let saved = SavedStatsMut {
        mean: &mut mean,
        rstd: &mut rstd,
    };
    cpu::layer_norm_forward(&shape, &x, affine, eps, &mut out, saved).unwrap();
    let (mut gin, mut gw, mut gb) = (
        vec![T::ZERO; x.len()],
        vec![T::ZERO; shape.cols],
        vec![T::ZERO; shape.cols],
    );
    let grads = NormGrads {
        input: Some(&mut gin[..]),
        weight: weight.is_some().then_some(&mut gw[..]),
        bias: weight.is_some().then_some(&mut gb[..]),
    };
    let saved = SavedStats {
        mean: &mean,
        rstd: &rstd,
    };
    cpu::layer_norm_backward(&shape, &dy, &x, weight.as_deref(), saved, grads).unwrap();
    [
        widen(&out),
        widen(&mean),
        widen(&rstd),
        widen(&gin),
        widen(&gw),
        widen(&gb),
    ]
}

#[test]
fn layer_norm_matches_pytorch() {
    let fixture = parse(FIXTURE);
    let keys = [
        "output",
        "mean",
        "rstd",
        "grad_input",
        "grad_weight",
        "grad_bias",
    ];
    for case in cases(&fixture, "layer_norm") {
        let name = case["name"].as_str().unwrap();
        for (run, tol, dtype) in [
            (run_layer_norm::<f64>(case), F64_TOL, "f64"),
            (run_layer_norm::<f32>(case), 1e-4, "f32"),
        ] {
            for (got, key) in run.iter().zip(keys) {
                if has(case, key) {
                    assert_close(
                        &format!("{name} {key} {dtype}"),
                        got,
                        &tensor(case, key).data,
                        tol,
                    );
                }
            }
        }
    }
}

#[test]
fn batch_norm_gradients_match_finite_differences() {
    let mut rng = Rng::new(13);
    let shape = BatchNormShape::from_input_shape(&[3, 2, 2, 2]).unwrap();
    let n = 24;
    let x = rng.vec(n);
    let w = rng.vec(2);
    let b = rng.vec(2);
    let upstream = rng.vec(n);
    let (rm, rv) = (vec![0.1, -0.2], vec![0.7, 1.3]);
    for training in [true, false] {
        let forward = |x: &[f64], w: &[f64], b: &[f64]| {
            let mut out = vec![0.0; n];
            let affine = Affine {
                weight: Some(w),
                bias: Some(b),
            };
            if training {
                let (mut m, mut r) = ([0.0; 2], [0.0; 2]);
                let saved = SavedStatsMut {
                    mean: &mut m,
                    rstd: &mut r,
                };
                cpu::batch_norm_train_forward(&shape, x, affine, None, 1e-5, &mut out, saved)
                    .unwrap();
            } else {
                let running = RunningStats {
                    mean: &rm,
                    var: &rv,
                };
                cpu::batch_norm_eval_forward(&shape, x, affine, running, 1e-5, &mut out).unwrap();
            }
            dot(&out, &upstream)
        };
        let (mut gin, mut gw, mut gb) = (vec![0.0; n], vec![0.0; 2], vec![0.0; 2]);
        let grads = NormGrads {
            input: Some(&mut gin[..]),
            weight: Some(&mut gw[..]),
            bias: Some(&mut gb[..]),
        };
        if training {
            let (mut m, mut r) = ([0.0; 2], [0.0; 2]);
            let saved = SavedStatsMut {
                mean: &mut m,
                rstd: &mut r,
            };
            let affine = Affine {
                weight: Some(&w[..]),
                bias: Some(&b[..]),
            };
            cpu::batch_norm_train_forward(&shape, &x, affine, None, 1e-5, &mut vec![0.0; n], saved)
                .unwrap();
            let saved = SavedStats { mean: &m, rstd: &r };
            cpu::batch_norm_train_backward(&shape, &upstream, &x, Some(&w), saved, grads).unwrap();
        } else {
            let running = RunningStats {
                mean: &rm,
                var: &rv,
            };
            cpu::batch_norm_eval_backward(&shape, &upstream, &x, Some(&w), running, 1e-5, grads)
                .unwrap();
        }
        let what = if training { "train" } else { "eval" };
        check_gradient(
            &format!("batch_norm {what} input"),
            |x| forward(x, &w, &b),
            &x,
            &gin,
            1e-6,
        );
        check_gradient(
            &format!("batch_norm {what} weight"),
            |w| forward(&x, w, &b),
            &w,
            &gw,
            1e-6,
        );
        check_gradient(
            &format!("batch_norm {what} bias"),
            |b| forward(&x, &w, b),
            &b,
            &gb,
            1e-6,
        );
    }
}

#[test]
fn layer_norm_gradients_match_finite_differences() {
    let mut rng = Rng::new(17);
    // 70 rows: more than two blocks of the parameter-gradient reduction.
    let shape = LayerNormShape::new(&[7, 10, 3], &[3]).unwrap();
    let n = 210;
    let (x, w, b, upstream) = (rng.vec(n), rng.vec(3), rng.vec(3), rng.vec(n));
    let forward = |x: &[f64], w: &[f64], b: &[f64]| {
        let mut out = vec![0.0; n];
        let (mut m, mut r) = (vec![0.0; 70], vec![0.0; 70]);
        let affine = Affine {
            weight: Some(w),
            bias: Some(b),
        };
        let saved = SavedStatsMut {
            mean: &mut m,
            rstd: &mut r,
        };
        cpu::layer_norm_forward(&shape, x, affine, 1e-5, &mut out, saved).unwrap();
        (dot(&out, &upstream), m, r)
    };
    let (_, m, r) = forward(&x, &w, &b);
    let (mut gin, mut gw, mut gb) = (vec![0.0; n], vec![0.0; 3], vec![0.0; 3]);
    let grads = NormGrads {
        input: Some(&mut gin[..]),
        weight: Some(&mut gw[..]),
        bias: Some(&mut gb[..]),
    };
    let saved = SavedStats { mean: &m, rstd: &r };
    cpu::layer_norm_backward(&shape, &upstream, &x, Some(&w), saved, grads).unwrap();
    check_gradient("layer_norm input", |x| forward(x, &w, &b).0, &x, &gin, 1e-6);
    check_gradient("layer_norm weight", |w| forward(&x, w, &b).0, &w, &gw, 1e-6);
    check_gradient("layer_norm bias", |b| forward(&x, &w, b).0, &b, &gb, 1e-6);
}

#[test]
fn norm_rejects_bad_shapes_with_named_errors() {
    let shape = BatchNormShape::from_input_shape(&[1, 3]).unwrap();
    let saved = SavedStatsMut {
        mean: &mut [0.0f32; 3],
        rstd: &mut [0.0; 3],
    };
    let err = cpu::batch_norm_train_forward(
        &shape,
        &[1.0; 3],
        Affine::none(),
        None,
        1e-5,
        &mut [0.0; 3],
        saved,
    )
    .unwrap_err();
    assert_eq!(
        err,
        KernelError::TooFewValuesPerChannel {
            op: "batch_norm",
            count: 1
        }
    );
    assert!(
        err.to_string()
            .contains("use a larger batch or input, or evaluation mode"),
        "{err}"
    );

    let err = BatchNormShape::from_input_shape(&[4]).unwrap_err();
    assert!(matches!(
        err,
        KernelError::InvalidShape {
            op: "batch_norm",
            ..
        }
    ));

    let shape = BatchNormShape::from_input_shape(&[2, 3]).unwrap();
    let saved = SavedStatsMut {
        mean: &mut [0.0f64; 3],
        rstd: &mut [0.0; 3],
    };
    let affine = Affine {
        weight: Some(&[1.0; 2]),
        bias: None,
    };
    let err =
        cpu::batch_norm_train_forward(&shape, &[1.0; 6], affine, None, 1e-5, &mut [0.0; 6], saved)
            .unwrap_err();
    assert!(matches!(
        err,
        KernelError::BufferLength {
            buffer: "weight",
            expected: 3,
            actual: 2,
            ..
        }
    ));

    let err = LayerNormShape::new(&[2, 3, 4], &[3]).unwrap_err();
    assert!(
        err.to_string()
            .contains("normalized_shape [3] must be a non-empty suffix"),
        "{err}"
    );
    assert!(LayerNormShape::new(&[2, 3, 4], &[]).is_err());
    assert_eq!(
        LayerNormShape::new(&[2, 3, 4], &[3, 4]).unwrap(),
        LayerNormShape::new(&[2, 12], &[12]).unwrap()
    );
}

#[test]
fn batch_norm_backward_computes_only_requested_gradients() {
    let shape = BatchNormShape::from_input_shape(&[2, 1, 2]).unwrap();
    let x = [1.0, 2.0, 4.0, 7.0];
    let (mut m, mut r) = ([0.0f64], [0.0]);
    let saved = SavedStatsMut {
        mean: &mut m,
        rstd: &mut r,
    };
    cpu::batch_norm_train_forward(&shape, &x, Affine::none(), None, 0.0, &mut [0.0; 4], saved)
        .unwrap();
    assert_eq!(m, [3.5]);
    assert!((r[0] - 1.0 / 5.25f64.sqrt()).abs() < 1e-15);
    let mut gb = [9.0];
    let grads = NormGrads {
        bias: Some(&mut gb[..]),
        ..Default::default()
    };
    let saved = SavedStats { mean: &m, rstd: &r };
    cpu::batch_norm_train_backward(&shape, &[1.0, 2.0, 3.0, 4.0], &x, None, saved, grads).unwrap();
    assert_eq!(gb, [10.0]);
}

#[test]
fn layer_norm_parameter_gradients_do_not_depend_on_the_thread_count() {
    let mut rng = Rng::new(29);
    let shape = LayerNormShape::new(&[100, 7], &[7]).unwrap();
    let (x, dy, w) = (rng.vec(700), rng.vec(700), rng.vec(7));
    let (mean, rstd) = (rng.vec(100), rng.vec(100));
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let (mut gw, mut gb) = (vec![0.0; 7], vec![0.0; 7]);
            let grads = NormGrads {
                weight: Some(&mut gw[..]),
                bias: Some(&mut gb[..]),
                ..Default::default()
            };
            let saved = SavedStats {
                mean: &mean,
                rstd: &rstd,
            };
            cpu::layer_norm_backward(&shape, &dy, &x, Some(&w), saved, grads).unwrap();
            (gw, gb)
        })
    };
    assert_eq!(run(1), run(3));
}
