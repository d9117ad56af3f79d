//! `batch_norm` with PyTorch's mixed dtypes: an F16/BF16 input with F32 weight, bias and
//! running statistics (what autocast hands it), training and evaluation, forward and backward.
//!
//! The reference is the all-f32 computation on the same values (the 16-bit input widened
//! exactly, the same f32 parameters and statistics, an upstream gradient representable in the
//! 16-bit dtype). The CPU's mixed path is that f32 computation with only the output and the
//! input gradient rounded, so on the CPU every result is asserted *bitwise*: the output and
//! the input gradient equal the f32 ones rounded once to the input dtype, and the f32 results
//! (running statistics, weight and bias gradients) equal the f32 run's exactly. On CUDA (when
//! a GPU is usable) the same comparison runs within `kiln_device::testing::tolerance` of each
//! result's dtype, times 4 for the few rounded steps the statistics pass through.

mod common;

use common::devices;
use kiln_autograd::{BatchNormOptions, DType, Device, Generator, Tensor};
use kiln_device::testing::{close, tolerance};

const SHAPE: [usize; 4] = [4, 3, 5, 2];

/// f32 values on the CPU that are exactly representable in `dtype`.
fn representable(seed: u64, shape: &[usize], dtype: DType) -> Tensor {
    Generator::new(seed)
        .normal(shape, 0.5, 1.5, dtype, Device::Cpu)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
}

fn f32_vec(seed: u64, n: usize, shift: f64) -> Tensor {
    Generator::new(seed)
        .normal(&[n], shift, 0.5, DType::F32, Device::Cpu)
        .unwrap()
}

/// What one batch norm run produced: values and dtypes.
struct Run {
    out: Tensor,
    grads: [Tensor; 3],
    running: [Tensor; 2],
}

/// Batch norm of `x` (moved to `dev`) with f32 weight/bias/running statistics copied from the
/// given CPU tensors, and the backward of `sum(out * upstream)`.
fn run(x: &Tensor, params: &[Tensor; 4], upstream: &Tensor, training: bool, dev: Device) -> Run {
    let x = x.to_device(dev).unwrap().detach();
    // fresh buffers (the running statistics are updated in place)
    let fresh = |p: &Tensor| {
        let vals: Vec<f32> = p.to_vec_f64().unwrap().iter().map(|&v| v as f32).collect();
        Tensor::from_vec(vals, p.shape(), dev).unwrap()
    };
    let [w, b, m, v] = params.each_ref().map(fresh);
    for t in [&x, &w, &b] {
        t.set_requires_grad(true).unwrap();
    }
    let options = BatchNormOptions {
        training,
        ..BatchNormOptions::default()
    };
    let out = x
        .batch_norm(Some(&m), Some(&v), Some(&w), Some(&b), options)
        .unwrap();
    let wide = out.to_dtype(DType::F32).unwrap();
    wide.mul(&upstream.to_device(dev).unwrap())
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(
        (m.version(), v.version()),
        if training { (1, 1) } else { (0, 0) },
        "running statistics are updated in place in training only"
    );
    Run {
        out,
        grads: [x.grad().unwrap(), w.grad().unwrap(), b.grad().unwrap()],
        running: [m, v],
    }
}

/// `got` against `want` (the f32 reference rounded to `got`'s dtype): bitwise on the CPU,
/// within the dtype's tolerance elsewhere.
fn check(what: &str, got: &Tensor, want: &Tensor, dtype: DType) {
    assert_eq!(got.dtype(), dtype, "{what}: dtype");
    let want = want.to_dtype(dtype).unwrap().to_vec_f64().unwrap();
    let got = got.to_vec_f64().unwrap();
    assert_eq!(got.len(), want.len(), "{what}: length");
    if got.is_empty() {
        return;
    }
    let (atol, rtol) = tolerance(dtype);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            close(*g, *w, (4.0 * atol, 4.0 * rtol)),
            "{what}[{i}]: {g} vs {w}"
        );
    }
}

fn check_exact(what: &str, got: &Tensor, want: &Tensor, dtype: DType) {
    assert_eq!(got.dtype(), dtype, "{what}: dtype");
    let want = want.to_dtype(dtype).unwrap().to_vec_f64().unwrap();
    assert_eq!(got.to_vec_f64().unwrap(), want, "{what}: bitwise");
}

#[test]
fn half_input_with_f32_parameters_matches_the_f32_computation() {
    let c = SHAPE[1];
    for dtype in [DType::BF16, DType::F16] {
        let x32 = representable(1, &SHAPE, dtype);
        let upstream = representable(2, &SHAPE, dtype);
        let params = [
            f32_vec(3, c, 1.0),
            f32_vec(4, c, 0.0),
            f32_vec(5, c, 0.2),
            f32_vec(6, c, 1.0).abs().unwrap().add_scalar(0.5).unwrap(),
        ];
        let x16 = x32.to_dtype(dtype).unwrap();
        for training in [true, false] {
            let want = run(&x32, &params, &upstream, training, Device::Cpu);
            for dev in devices() {
                let what = format!("{dtype} training={training} on {dev:?}");
                let got = run(&x16, &params, &upstream, training, dev);
                let assert_eq_dt = |name: &str, g: &Tensor, w: &Tensor, dt: DType| {
                    let name = format!("{what}: {name}");
                    if dev == Device::Cpu {
                        check_exact(&name, g, w, dt);
                    } else {
                        check(&name, g, w, dt);
                    }
                };
                // the output and the input gradient have the input's dtype
                assert_eq_dt("output", &got.out, &want.out, dtype);
                assert_eq_dt("grad input", &got.grads[0], &want.grads[0], dtype);
                // the weight/bias gradients and the running statistics stay f32
                assert_eq_dt("grad weight", &got.grads[1], &want.grads[1], DType::F32);
                assert_eq_dt("grad bias", &got.grads[2], &want.grads[2], DType::F32);
                assert_eq_dt(
                    "running mean",
                    &got.running[0],
                    &want.running[0],
                    DType::F32,
                );
                assert_eq_dt("running var", &got.running[1], &want.running[1], DType::F32);
            }
            if training {
                // the reference did move the statistics (so the comparison above means something)
                assert_ne!(
                    want.running[0].to_vec_f64().unwrap(),
                    params[2].to_vec_f64().unwrap()
                );
            }
        }
    }
}

#[test]
fn mixed_dtypes_other_than_half_input_with_f32_vectors_are_refused() {
    let x = representable(7, &[2, 3, 2], DType::BF16);
    let (w32, w16) = (
        f32_vec(8, 3, 1.0),
        f32_vec(8, 3, 1.0).to_dtype(DType::BF16).unwrap(),
    );
    let train = BatchNormOptions::default();
    // f32 input, bf16 weight
    let e = x
        .batch_norm(None, None, Some(&w16), None, train)
        .unwrap_err()
        .to_string();
    assert!(e.contains("batch_norm") && e.contains("to_dtype"), "{e}");
    assert!(e.contains("weight bfloat16"), "{e}");
    // bf16 input, an f32 weight with a bf16 bias
    let e = x
        .to_dtype(DType::BF16)
        .unwrap()
        .batch_norm(None, None, Some(&w32), Some(&w16), train)
        .unwrap_err()
        .to_string();
    assert!(e.contains("bias") && e.contains("to_dtype"), "{e}");
    // f64 vectors with a bf16 input
    let e = x
        .to_dtype(DType::BF16)
        .unwrap()
        .batch_norm(
            None,
            None,
            Some(&w32.to_dtype(DType::F64).unwrap()),
            None,
            train,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("to_dtype"), "{e}");
}
