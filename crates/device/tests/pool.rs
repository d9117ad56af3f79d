//! Pooling kernels: PyTorch parity (forward, indices and backward, f64 and f32),
//! finite-difference gradient checks, and parameter/index errors.

mod common;

use common::*;
use kiln_device::ops::pool::{
    cpu, AdaptiveAvgPool2dGeometry, AvgPool2dGeometry, AvgPool2dParams, MaxPool2dGeometry,
    MaxPool2dParams,
};
use kiln_device::ops::{KernelError, KernelFloat};

const FIXTURE: &str = include_str!("fixtures/pool.json");

fn max_params(case: &serde_json::Value) -> MaxPool2dParams {
    MaxPool2dParams {
        kernel_size: pair(case, "kernel_size"),
        stride: pair(case, "stride"),
        padding: pair(case, "padding"),
        dilation: pair(case, "dilation"),
        ceil_mode: case["ceil_mode"].as_bool().unwrap(),
    }
}

fn avg_params(case: &serde_json::Value) -> AvgPool2dParams {
    AvgPool2dParams {
        kernel_size: pair(case, "kernel_size"),
        stride: pair(case, "stride"),
        padding: pair(case, "padding"),
        ceil_mode: case["ceil_mode"].as_bool().unwrap(),
        count_include_pad: case["count_include_pad"].as_bool().unwrap(),
        divisor_override: case["divisor_override"].as_u64().map(|d| d as usize),
    }
}

fn numel(shape: [usize; 4]) -> usize {
    shape.iter().product()
}

fn widen<T: Into<f64> + Copy>(v: &[T]) -> Vec<f64> {
    v.iter().map(|&x| x.into()).collect()
}

fn max_pool<T: KernelFloat + Into<f64>>(
    g: &MaxPool2dGeometry,
    input: &[T],
    grad_output: &[T],
) -> (Vec<f64>, Vec<i64>, Vec<f64>) {
    let mut out = vec![T::ZERO; numel(g.shape.output_shape())];
    let mut idx = vec![0i64; out.len()];
    cpu::max_pool2d_forward(g, input, &mut out, &mut idx).unwrap();
    let mut gin = vec![T::ZERO; input.len()];
    cpu::max_pool2d_backward(g, grad_output, &idx, &mut gin).unwrap();
    (widen(&out), idx, widen(&gin))
}

#[test]
fn max_pool2d_matches_pytorch() {
    let fixture = parse(FIXTURE);
    for case in cases(&fixture, "max_pool2d") {
        let name = case["name"].as_str().unwrap();
        let input = tensor(case, "input");
        let grad_output = tensor(case, "grad_output");
        let g = MaxPool2dGeometry::new(input.shape4(), max_params(case)).unwrap();
        assert_eq!(
            g.shape.output_shape().to_vec(),
            grad_output.shape,
            "{name}: shape"
        );
        let (out, idx, gin) = max_pool(&g, &input.data, &grad_output.data);
        assert_close(
            &format!("{name} output"),
            &out,
            &tensor(case, "output").data,
            F64_TOL,
        );
        assert_eq!(idx, tensor(case, "indices").i64(), "{name}: indices");
        assert_close(
            &format!("{name} grad_input"),
            &gin,
            &tensor(case, "grad_input").data,
            F64_TOL,
        );
        let (out, idx, gin) = max_pool(&g, &input.f32(), &grad_output.f32());
        assert_close(
            &format!("{name} output f32"),
            &out,
            &tensor(case, "output").data,
            F32_TOL,
        );
        assert_eq!(idx, tensor(case, "indices").i64(), "{name}: indices f32");
        assert_close(
            &format!("{name} grad_input f32"),
            &gin,
            &tensor(case, "grad_input").data,
            F32_TOL,
        );
    }
}

fn avg_pool<T: KernelFloat + Into<f64>>(
    g: &AvgPool2dGeometry,
    input: &[T],
    grad_output: &[T],
) -> (Vec<f64>, Vec<f64>) {
    let mut out = vec![T::ZERO; numel(g.shape.output_shape())];
    cpu::avg_pool2d_forward(g, input, &mut out).unwrap();
    let mut gin = vec![T::ZERO; input.len()];
    cpu::avg_pool2d_backward(g, grad_output, &mut gin).unwrap();
    (widen(&out), widen(&gin))
}

#[test]
fn avg_pool2d_matches_pytorch() {
    let fixture = parse(FIXTURE);
    for case in cases(&fixture, "avg_pool2d") {
        let name = case["name"].as_str().unwrap();
        let input = tensor(case, "input");
        let grad_output = tensor(case, "grad_output");
        let g = AvgPool2dGeometry::new(input.shape4(), avg_params(case)).unwrap();
        assert_eq!(
            g.shape.output_shape().to_vec(),
            grad_output.shape,
            "{name}: shape"
        );
        let (out, gin) = avg_pool(&g, &input.data, &grad_output.data);
        assert_close(
            &format!("{name} output"),
            &out,
            &tensor(case, "output").data,
            F64_TOL,
        );
        assert_close(
            &format!("{name} grad_input"),
            &gin,
            &tensor(case, "grad_input").data,
            F64_TOL,
        );
        let (out, gin) = avg_pool(&g, &input.f32(), &grad_output.f32());
        assert_close(
            &format!("{name} output f32"),
            &out,
            &tensor(case, "output").data,
            F32_TOL,
        );
        assert_close(
            &format!("{name} grad_input f32"),
            &gin,
            &tensor(case, "grad_input").data,
            F32_TOL,
        );
    }
}

fn adaptive<T: KernelFloat + Into<f64>>(
    g: &AdaptiveAvgPool2dGeometry,
    input: &[T],
    grad_output: &[T],
) -> (Vec<f64>, Vec<f64>) {
    let mut out = vec![T::ZERO; numel(g.shape.output_shape())];
    cpu::adaptive_avg_pool2d_forward(g, input, &mut out).unwrap();
    let mut gin = vec![T::ZERO; input.len()];
    cpu::adaptive_avg_pool2d_backward(g, grad_output, &mut gin).unwrap();
    (widen(&out), widen(&gin))
}

#[test]
fn adaptive_avg_pool2d_matches_pytorch() {
    let fixture = parse(FIXTURE);
    for case in cases(&fixture, "adaptive_avg_pool2d") {
        let name = case["name"].as_str().unwrap();
        let input = tensor(case, "input");
        let grad_output = tensor(case, "grad_output");
        let g = AdaptiveAvgPool2dGeometry::new(input.shape4(), pair(case, "output_size")).unwrap();
        let (out, gin) = adaptive(&g, &input.data, &grad_output.data);
        assert_close(
            &format!("{name} output"),
            &out,
            &tensor(case, "output").data,
            F64_TOL,
        );
        assert_close(
            &format!("{name} grad_input"),
            &gin,
            &tensor(case, "grad_input").data,
            F64_TOL,
        );
        let (out, gin) = adaptive(&g, &input.f32(), &grad_output.f32());
        assert_close(
            &format!("{name} output f32"),
            &out,
            &tensor(case, "output").data,
            F32_TOL,
        );
        assert_close(
            &format!("{name} grad_input f32"),
            &gin,
            &tensor(case, "grad_input").data,
            F32_TOL,
        );
    }
}

#[test]
fn pooling_gradients_match_finite_differences() {
    let mut rng = Rng::new(5);
    let shape = [2, 2, 5, 6];
    // Distinct values far apart keep max pooling differentiable at the probe points.
    let mut input: Vec<f64> = (0..numel(shape)).map(|i| i as f64 * 0.37 % 7.0).collect();
    input.iter_mut().for_each(|v| *v += 0.01 * rng.uniform());

    let mut mp = MaxPool2dParams::new([3, 2]);
    mp.stride = [2, 1];
    mp.padding = [1, 1];
    mp.dilation = [1, 2];
    mp.ceil_mode = true;
    let g = MaxPool2dGeometry::new(shape, mp).unwrap();
    let upstream = rng.vec(numel(g.shape.output_shape()));
    let (_, _, gin) = max_pool(&g, &input, &upstream);
    let loss = |x: &[f64]| dot(&max_pool(&g, x, &upstream).0, &upstream);
    check_gradient("max_pool2d", loss, &input, &gin, 1e-6);

    for count_include_pad in [true, false] {
        let mut ap = AvgPool2dParams::new([3, 3]);
        ap.stride = [2, 2];
        ap.padding = [1, 1];
        ap.ceil_mode = true;
        ap.count_include_pad = count_include_pad;
        let g = AvgPool2dGeometry::new(shape, ap).unwrap();
        let upstream = rng.vec(numel(g.shape.output_shape()));
        let (_, gin) = avg_pool(&g, &input, &upstream);
        let loss = |x: &[f64]| dot(&avg_pool(&g, x, &upstream).0, &upstream);
        check_gradient("avg_pool2d", loss, &input, &gin, 1e-6);
    }

    let g = AdaptiveAvgPool2dGeometry::new(shape, [4, 4]).unwrap();
    let upstream = rng.vec(numel(g.shape.output_shape()));
    let (_, gin) = adaptive(&g, &input, &upstream);
    let loss = |x: &[f64]| dot(&adaptive(&g, x, &upstream).0, &upstream);
    check_gradient("adaptive_avg_pool2d", loss, &input, &gin, 1e-6);
}

#[test]
fn max_pool2d_prefers_nan_and_the_first_of_equal_maxima() {
    let g = MaxPool2dGeometry::new([1, 1, 2, 2], MaxPool2dParams::new([2, 2])).unwrap();
    let (mut out, mut idx) = ([0.0f32], [0i64]);
    cpu::max_pool2d_forward(&g, &[1.0, 3.0, 3.0, 2.0], &mut out, &mut idx).unwrap();
    assert_eq!((out[0], idx[0]), (3.0, 1));
    cpu::max_pool2d_forward(&g, &[1.0, f32::NAN, 3.0, 2.0], &mut out, &mut idx).unwrap();
    assert!(out[0].is_nan());
    assert_eq!(idx[0], 1);
    cpu::max_pool2d_forward(&g, &[f32::NEG_INFINITY; 4], &mut out, &mut idx).unwrap();
    assert_eq!((out[0], idx[0]), (f32::NEG_INFINITY, 0));
}

#[test]
fn pooling_rejects_bad_parameters_with_named_errors() {
    let mut p = MaxPool2dParams::new([3, 3]);
    p.stride = [0, 1];
    let err = MaxPool2dGeometry::new([1, 1, 5, 5], p).unwrap_err();
    assert_eq!(
        err,
        KernelError::ZeroParameter {
            op: "max_pool2d",
            param: "stride"
        }
    );

    let mut p = MaxPool2dParams::new([3, 3]);
    p.padding = [0, 2];
    let err = MaxPool2dGeometry::new([1, 1, 5, 5], p).unwrap_err();
    assert_eq!(
        err,
        KernelError::PaddingTooLarge {
            op: "max_pool2d",
            axis: "width",
            padding: 2,
            kernel: 3
        }
    );
    assert!(
        err.to_string().contains("use padding <= kernel_size / 2"),
        "{err}"
    );

    let err = AvgPool2dGeometry::new([1, 1, 2, 5], AvgPool2dParams::new([3, 3])).unwrap_err();
    assert_eq!(
        err,
        KernelError::WindowLargerThanInput {
            op: "avg_pool2d",
            axis: "height",
            window: 3,
            padded_input: 2
        }
    );
    // ceil_mode lets a kernel larger than the input produce one (clipped) window, as in PyTorch.
    let mut p = MaxPool2dParams::new([3, 3]);
    p.stride = [2, 2];
    p.ceil_mode = true;
    let g = MaxPool2dGeometry::new([1, 1, 2, 2], p).unwrap();
    assert_eq!(g.shape.output_size, [1, 1]);

    // Dilation 2 with padding 1 on a 1-pixel input: the only window sees just padding.
    let mut p = MaxPool2dParams::new([3, 3]);
    p.stride = [3, 3];
    p.padding = [1, 1];
    p.dilation = [2, 2];
    p.ceil_mode = true;
    let err = MaxPool2dGeometry::new([1, 1, 1, 1], p).unwrap_err();
    assert_eq!(
        err,
        KernelError::EmptyPoolingWindow {
            op: "max_pool2d",
            axis: "height",
            output_index: 0
        }
    );

    let mut p = AvgPool2dParams::new([2, 2]);
    p.divisor_override = Some(0);
    let err = AvgPool2dGeometry::new([1, 1, 4, 4], p).unwrap_err();
    assert_eq!(
        err,
        KernelError::ZeroParameter {
            op: "avg_pool2d",
            param: "divisor_override"
        }
    );

    let err = AdaptiveAvgPool2dGeometry::new([1, 1, 4, 4], [0, 2]).unwrap_err();
    assert_eq!(
        err,
        KernelError::ZeroParameter {
            op: "adaptive_avg_pool2d",
            param: "output_size"
        }
    );
    let err = AdaptiveAvgPool2dGeometry::new([1, 1, 0, 4], [2, 2]).unwrap_err();
    assert!(matches!(
        err,
        KernelError::InvalidShape {
            op: "adaptive_avg_pool2d",
            ..
        }
    ));
}

#[test]
fn max_pool2d_backward_rejects_indices_outside_the_plane() {
    let g = MaxPool2dGeometry::new([1, 2, 2, 2], MaxPool2dParams::new([2, 1])).unwrap();
    assert_eq!(g.shape.output_shape(), [1, 2, 1, 2]);
    let mut gin = [7.0f64; 8];
    let err = cpu::max_pool2d_backward(&g, &[1.0; 4], &[0, 1, 3, 4], &mut gin).unwrap_err();
    assert_eq!(
        err,
        KernelError::IndexOutOfRange {
            op: "max_pool2d_backward",
            index: 4,
            position: vec![0, 1, 0, 1],
            dim: 2,
            size: 4,
        }
    );
    assert_eq!(
        gin, [7.0; 8],
        "nothing is written before the indices are validated"
    );
    // Indices checked in parallel pieces: the first bad one is reported by its own position,
    // however many pieces come before it or bad ones after it.
    let big = MaxPool2dGeometry::new([2, 3, 200, 200], MaxPool2dParams::new([2, 2])).unwrap();
    assert_eq!(big.shape.output_shape(), [2, 3, 100, 100]);
    let mut indices = vec![0i64; 60_000];
    indices[40_123] = -1;
    indices[50_000] = 40_000;
    indices[59_999] = -7;
    let mut big_gin = vec![0.0f32; 240_000];
    let err =
        cpu::max_pool2d_backward(&big, &vec![1.0; 60_000], &indices, &mut big_gin).unwrap_err();
    assert_eq!(
        err,
        KernelError::IndexOutOfRange {
            op: "max_pool2d_backward",
            index: -1,
            position: vec![1, 1, 1, 23],
            dim: 2,
            size: 40_000,
        }
    );
    let err = cpu::max_pool2d_backward(&g, &[1.0; 3], &[0; 4], &mut gin).unwrap_err();
    assert!(matches!(
        err,
        KernelError::BufferLength {
            buffer: "grad_output",
            expected: 4,
            actual: 3,
            ..
        }
    ));
}
