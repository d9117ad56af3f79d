//! Layers refuse configurations and inputs they cannot compute, each with an error naming the
//! layer and what is wrong (PyTorch's own rules where it has them), and the approximate GELU is
//! the tanh formula, not the exact one.

use kiln_autograd::{DType, Device, Tensor};
use kiln_models::layers::{
    AdaptiveAvgPool2d, AvgPool2d, Conv2d, Conv2dConfig, Flatten, LayerNorm, MaxPool2d, GELU,
};
use kiln_models::{summary, Layer};

fn zeros(shape: &[usize]) -> Tensor {
    Tensor::zeros(shape, DType::F32, Device::Cpu).unwrap()
}

fn refused(result: kiln_models::Result<impl std::fmt::Debug>, wanted: &str) {
    let e = result.unwrap_err().to_string();
    assert!(e.contains(wanted), "wanted `{wanted}` in: {e}");
}

#[test]
fn a_grouped_dilated_convolution_checks_channels_and_its_dilated_kernel() {
    // 4 input channels in 2 groups (weight [6, 2, 3, 3]), dilation 2: the kernel spans 5.
    let config = Conv2dConfig {
        dilation: [2, 2],
        groups: 2,
        ..Conv2dConfig::default()
    };
    let conv = Conv2d::new(4, 6, 3, config).unwrap();
    assert_eq!(conv.weight.shape(), [6, 2, 3, 3]);
    assert_eq!(
        conv.forward(&zeros(&[1, 4, 5, 5])).unwrap().shape(),
        [1, 6, 1, 1]
    );
    refused(
        conv.forward(&zeros(&[1, 4, 4, 5])),
        "is smaller than the dilated kernel (5)",
    );
    // The weight's second dim is channels per group: a 2-channel input is not what it takes.
    refused(
        conv.forward(&zeros(&[1, 2, 5, 5])),
        "expected a [N, 4, H, W] input",
    );
}

#[test]
fn pooling_refuses_padding_over_half_the_kernel_and_empty_planes() {
    // PyTorch: "pad should be at most half of effective kernel size".
    refused(MaxPool2d::new(2, 2, 2), "at most half the kernel");
    refused(AvgPool2d::new(3, 1, 2), "at most half the kernel");
    assert!(MaxPool2d::new(3, 2, 1).is_ok());
    assert!(AvgPool2d::new(2, 2, 1).is_ok());
    let adaptive = AdaptiveAvgPool2d::new([1, 1]).unwrap();
    refused(
        adaptive.forward(&zeros(&[1, 3, 0, 4])),
        "expected a non-empty [N, C, H, W] input, got [1, 3, 0, 4]",
    );
    assert_eq!(
        adaptive.forward(&zeros(&[1, 3, 2, 4])).unwrap().shape(),
        [1, 3, 1, 1]
    );
}

#[test]
fn layer_norm_and_flatten_name_shapes_they_cannot_take() {
    let norm = LayerNorm::new(&[4], 1e-5).unwrap();
    refused(
        norm.forward(&zeros(&[2, 3])),
        "must end with the normalized shape [4]",
    );
    assert_eq!(norm.forward(&zeros(&[2, 4])).unwrap().shape(), [2, 4]);
    // Flatten(start_dim=2, end_dim=1): an empty range of dims.
    let mut flatten = Flatten::new();
    flatten.start_dim = 2;
    flatten.end_dim = 1;
    refused(summary(&flatten, &[2, 3, 4]), "dims 2..=1 do not fit");
    flatten.end_dim = -1;
    assert!(summary(&flatten, &[2, 3, 4]).is_ok());
}

#[test]
fn gelu_tanh_is_the_approximation_and_gelu_the_exact_form() {
    let xs = [-2.0f64, -0.5, 1.0, 3.0];
    let x = Tensor::from_vec(xs.map(|v| v as f32).to_vec(), &[4], Device::Cpu).unwrap();
    let exact = GELU::new().forward(&x).unwrap().to_vec_f64().unwrap();
    let tanh = GELU::tanh().forward(&x).unwrap().to_vec_f64().unwrap();
    // x * Phi(x) (values of the standard normal CDF), and PyTorch's tanh approximation.
    let phi = [
        0.022_750_131_948_179_2,
        0.308_537_538_725_986_9,
        0.841_344_746_068_542_9,
        0.998_650_101_968_369_9,
    ];
    for (i, &v) in xs.iter().enumerate() {
        let want_tanh = 0.5
            * v
            * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044_715 * v.powi(3))).tanh());
        assert!(
            (exact[i] - v * phi[i]).abs() < 1e-6,
            "gelu({v}) = {}",
            exact[i]
        );
        assert!(
            (tanh[i] - want_tanh).abs() < 1e-6,
            "gelu_tanh({v}) = {}",
            tanh[i]
        );
    }
    // The two differ by more than the tolerance at 1 (1.5e-4), so each check tells them apart.
    assert!((exact[2] - tanh[2]).abs() > 1e-4);
}
