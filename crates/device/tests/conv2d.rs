//! conv2d kernels: PyTorch parity (forward and all three gradients, f64 and f32), agreement
//! with the plain-loop reference on random configurations (both parallel strategies),
//! finite-difference gradient checks, and parameter errors.

mod common;

use common::*;
use kiln_device::ops::conv::{cpu, reference, Conv2dGeometry, Conv2dParams};
use kiln_device::ops::{KernelError, KernelFloat};

const FIXTURE: &str = include_str!("fixtures/conv2d.json");

fn params(case: &serde_json::Value) -> Conv2dParams {
    Conv2dParams {
        stride: pair(case, "stride"),
        padding: pair(case, "padding"),
        dilation: pair(case, "dilation"),
        groups: case["groups"].as_u64().unwrap() as usize,
    }
}

/// Runs forward and the three backward kernels in `T`, returning
/// `(output, grad_input, grad_weight, grad_bias)` widened to `f64`.
fn run_all<T: KernelFloat + Into<f64>>(
    g: &Conv2dGeometry,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    grad_output: &[T],
) -> [Vec<f64>; 4] {
    let numel = |s: [usize; 4]| s.iter().product::<usize>();
    let mut output = vec![T::ZERO; numel(g.output_shape())];
    cpu::conv2d_forward(g, input, weight, bias, &mut output).unwrap();
    let mut grad_input = vec![T::ZERO; numel(g.input_shape())];
    cpu::conv2d_backward_input(g, grad_output, weight, &mut grad_input).unwrap();
    let mut grad_weight = vec![T::ZERO; numel(g.weight_shape())];
    cpu::conv2d_backward_weight(g, input, grad_output, &mut grad_weight).unwrap();
    let mut grad_bias = vec![T::ZERO; g.out_channels];
    cpu::conv2d_backward_bias(g, grad_output, &mut grad_bias).unwrap();
    [output, grad_input, grad_weight, grad_bias].map(|v| v.into_iter().map(Into::into).collect())
}

#[test]
fn conv2d_matches_pytorch_forward_and_backward() {
    let fixture = parse(FIXTURE);
    let all = cases(&fixture, "conv2d");
    assert_eq!(all.len(), 7);
    for case in all {
        let name = case["name"].as_str().unwrap();
        let (input, weight) = (tensor(case, "input"), tensor(case, "weight"));
        let grad_output = tensor(case, "grad_output");
        let bias = has(case, "bias").then(|| tensor(case, "bias"));
        let g = Conv2dGeometry::new(input.shape4(), weight.shape4(), params(case)).unwrap();
        assert_eq!(
            g.output_shape().to_vec(),
            tensor(case, "output").shape,
            "{name}: shape"
        );
        let keys = ["output", "grad_input", "grad_weight", "grad_bias"];

        let got64 = run_all(
            &g,
            &input.data,
            &weight.data,
            bias.as_ref().map(|b| &b.data[..]),
            &grad_output.data,
        );
        let bias32 = bias.as_ref().map(|b| b.f32());
        let got32 = run_all(
            &g,
            &input.f32(),
            &weight.f32(),
            bias32.as_deref(),
            &grad_output.f32(),
        );
        for (k, key) in keys.iter().enumerate() {
            if *key == "grad_bias" && bias.is_none() {
                continue;
            }
            let expected = tensor(case, key).data;
            assert_close(&format!("{name} {key} f64"), &got64[k], &expected, F64_TOL);
            assert_close(&format!("{name} {key} f32"), &got32[k], &expected, 1e-4);
        }
    }
}

/// Random configurations, each checked against the plain-loop reference.
fn random_configs() -> Vec<([usize; 4], [usize; 4], Conv2dParams)> {
    let mut rng = Rng::new(7);
    let mut configs = Vec::new();
    while configs.len() < 24 {
        let groups = 1 + rng.below(3);
        let input = [
            1 + rng.below(5),
            groups * (1 + rng.below(3)),
            1 + rng.below(8),
            1 + rng.below(8),
        ];
        let weight = [
            groups * (1 + rng.below(3)),
            input[1] / groups,
            1 + rng.below(4),
            1 + rng.below(4),
        ];
        let params = Conv2dParams {
            stride: [1 + rng.below(3), 1 + rng.below(3)],
            padding: [rng.below(3), rng.below(3)],
            dilation: [1 + rng.below(2), 1 + rng.below(3)],
            groups,
        };
        if Conv2dGeometry::new(input, weight, params).is_ok() {
            configs.push((input, weight, params));
        }
    }
    // The 1x1 fast path with several images.
    configs.push((
        [5, 4, 3, 5],
        [6, 2, 1, 1],
        Conv2dParams {
            groups: 2,
            ..Default::default()
        },
    ));
    // Strided 1x1 convolutions without padding (ResNet's shortcuts), which read one phase of
    // the stride straight from the image: per image (289 and 294 output positions, even and
    // odd input widths, two groups), in chunks of images (198 positions), and one image.
    let subsampling = |stride, groups| Conv2dParams {
        stride,
        groups,
        ..Default::default()
    };
    configs.push(([3, 4, 33, 34], [6, 2, 1, 1], subsampling([2, 2], 2)));
    configs.push(([4, 3, 40, 41], [2, 3, 1, 1], subsampling([3, 2], 1)));
    configs.push(([2, 3, 35, 31], [5, 3, 1, 1], subsampling([2, 3], 1)));
    configs.push(([1, 3, 9, 9], [4, 3, 1, 1], subsampling([2, 2], 1)));
    configs
}

fn check_against_reference() {
    let mut rng = Rng::new(11);
    for (input_shape, weight_shape, params) in random_configs() {
        let g = Conv2dGeometry::new(input_shape, weight_shape, params).unwrap();
        let numel = |s: [usize; 4]| s.iter().product::<usize>();
        let input = rng.vec(numel(g.input_shape()));
        let weight = rng.vec(numel(g.weight_shape()));
        let bias = rng.vec(g.out_channels);
        let grad_output = rng.vec(numel(g.output_shape()));
        let [out, gin, gw, _] = run_all(&g, &input, &weight, Some(&bias), &grad_output);
        let mut expected = vec![0.0; out.len()];
        reference::conv2d_forward(&g, &input, &weight, Some(&bias), &mut expected).unwrap();
        assert_close(&format!("{g:?} forward"), &out, &expected, 1e-12);
        let mut expected = vec![0.0; gin.len()];
        reference::conv2d_backward_input(&g, &grad_output, &weight, &mut expected).unwrap();
        assert_close(&format!("{g:?} grad_input"), &gin, &expected, 1e-12);
        let mut expected = vec![0.0; gw.len()];
        reference::conv2d_backward_weight(&g, &input, &grad_output, &mut expected).unwrap();
        assert_close(&format!("{g:?} grad_weight"), &gw, &expected, 1e-12);
    }
}

#[test]
fn conv2d_matches_plain_loops_on_random_configs_single_thread() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    pool.install(check_against_reference);
}

#[test]
fn conv2d_matches_plain_loops_on_random_configs_three_threads() {
    // Batches of 1..=5 images on 3 threads exercise both the per-image split and the
    // parallel-gemm path, and uneven weight-gradient slices.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    pool.install(check_against_reference);
}

#[test]
fn conv2d_gradients_match_finite_differences() {
    let mut rng = Rng::new(3);
    let configs = [
        (
            [2, 4, 5, 4],
            [4, 2, 3, 2],
            Conv2dParams {
                stride: [2, 1],
                padding: [1, 1],
                dilation: [1, 2],
                groups: 2,
            },
        ),
        ([1, 2, 4, 4], [3, 2, 1, 1], Conv2dParams::default()),
    ];
    for (input_shape, weight_shape, params) in configs {
        let g = Conv2dGeometry::new(input_shape, weight_shape, params).unwrap();
        let numel = |s: [usize; 4]| s.iter().product::<usize>();
        let input = rng.vec(numel(g.input_shape()));
        let weight = rng.vec(numel(g.weight_shape()));
        let bias = rng.vec(g.out_channels);
        let upstream = rng.vec(numel(g.output_shape()));
        let loss = |x: &[f64], w: &[f64], b: &[f64]| {
            let mut out = vec![0.0; upstream.len()];
            cpu::conv2d_forward(&g, x, w, Some(b), &mut out).unwrap();
            dot(&out, &upstream)
        };
        let [_, gin, gw, gb] = run_all(&g, &input, &weight, Some(&bias), &upstream);
        check_gradient(
            "conv2d input",
            |x| loss(x, &weight, &bias),
            &input,
            &gin,
            1e-6,
        );
        check_gradient(
            "conv2d weight",
            |w| loss(&input, w, &bias),
            &weight,
            &gw,
            1e-6,
        );
        check_gradient(
            "conv2d bias",
            |b| loss(&input, &weight, b),
            &bias,
            &gb,
            1e-6,
        );
    }
}

#[test]
fn conv2d_rejects_bad_parameters_with_named_errors() {
    let ok = Conv2dParams::default();
    let zero_stride = Conv2dParams {
        stride: [0, 1],
        ..ok
    };
    let err = Conv2dGeometry::new([1, 2, 5, 5], [3, 2, 3, 3], zero_stride).unwrap_err();
    assert_eq!(
        err,
        KernelError::ZeroParameter {
            op: "conv2d",
            param: "stride"
        }
    );
    assert_eq!(
        err.to_string(),
        "conv2d: `stride` is 0; it must be at least 1"
    );

    let groups3 = Conv2dParams { groups: 3, ..ok };
    let err = Conv2dGeometry::new([1, 4, 5, 5], [3, 1, 3, 3], groups3).unwrap_err();
    assert!(matches!(
        err,
        KernelError::NotDivisibleByGroups {
            channels_name: "in_channels",
            channels: 4,
            groups: 3,
            ..
        }
    ));
    assert!(
        err.to_string()
            .contains("in_channels = 4 is not divisible by groups = 3"),
        "{err}"
    );

    let groups2 = Conv2dParams { groups: 2, ..ok };
    let err = Conv2dGeometry::new([1, 4, 5, 5], [3, 2, 3, 3], groups2).unwrap_err();
    assert!(matches!(
        err,
        KernelError::NotDivisibleByGroups {
            channels_name: "out_channels",
            ..
        }
    ));

    let err = Conv2dGeometry::new([1, 4, 5, 5], [4, 4, 3, 3], groups2).unwrap_err();
    assert!(matches!(
        err,
        KernelError::WeightChannelMismatch { expected: 2, .. }
    ));
    assert!(
        err.to_string()
            .contains("use a weight of shape [out_channels, 2, kernel_h, kernel_w]"),
        "{err}"
    );

    let dilated = Conv2dParams {
        dilation: [1, 3],
        ..ok
    };
    let err = Conv2dGeometry::new([1, 2, 5, 5], [3, 2, 3, 3], dilated).unwrap_err();
    assert_eq!(
        err,
        KernelError::WindowLargerThanInput {
            op: "conv2d",
            axis: "width",
            window: 7,
            padded_input: 5
        }
    );
    assert!(
        err.to_string()
            .contains("use a smaller kernel or dilation, more padding"),
        "{err}"
    );
    // With one column of padding on each side the dilated kernel fits exactly: one output column.
    let padded = Conv2dParams {
        padding: [0, 1],
        ..dilated
    };
    let g = Conv2dGeometry::new([1, 2, 5, 5], [3, 2, 3, 3], padded).unwrap();
    assert_eq!(g.output_shape(), [1, 3, 3, 1]);
}

#[test]
fn conv2d_rejects_slices_of_the_wrong_length() {
    let g = Conv2dGeometry::new([2, 3, 4, 4], [5, 3, 3, 3], Conv2dParams::default()).unwrap();
    let input = vec![0.0f32; 2 * 3 * 16];
    let weight = vec![0.0f32; 5 * 3 * 9];
    let mut output = vec![0.0f32; 2 * 5 * 4 - 1];
    // The CPU kernels return the crate-wide error (they can also run out of memory); a bad slice
    // is the kernel error inside it.
    let kernel = |e: kiln_device::Error| e.kernel_error().cloned().expect("a kernel error");
    let err = kernel(cpu::conv2d_forward(&g, &input, &weight, None, &mut output).unwrap_err());
    assert_eq!(
        err,
        KernelError::BufferLength {
            op: "conv2d",
            buffer: "output",
            shape: vec![2, 5, 2, 2],
            expected: 40,
            actual: 39
        }
    );
    assert!(err
        .to_string()
        .contains("pass a contiguous buffer with exactly 40 elements"));
    let err = kernel(
        cpu::conv2d_forward(&g, &input, &weight, Some(&[0.0; 4]), &mut [0.0; 40]).unwrap_err(),
    );
    assert!(matches!(
        err,
        KernelError::BufferLength {
            buffer: "bias",
            expected: 5,
            actual: 4,
            ..
        }
    ));
    let err = kernel(
        cpu::conv2d_backward_weight(&g, &input[1..], &[0.0; 40], &mut vec![0.0; 135]).unwrap_err(),
    );
    assert!(matches!(
        err,
        KernelError::BufferLength {
            buffer: "input",
            ..
        }
    ));
}
