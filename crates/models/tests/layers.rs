//! Layer forward passes that run on kiln-autograd's core ops, against hand values and PyTorch.

use kiln_autograd::{manual_seed, DType, Device, Module, Tensor};
use kiln_models::layers::{AttentionMasks, Dropout, Linear, MultiheadAttention};
use kiln_models::models::mlp;
use kiln_models::{Error, Layer, LayerExt};

fn t(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape, Device::Cpu).unwrap()
}

fn set(dst: &Tensor, v: &[f32]) {
    let _g = kiln_autograd::NoGradGuard::new();
    dst.copy_(&t(v, dst.shape())).unwrap();
}

#[test]
fn linear_computes_x_wt_plus_b_and_its_gradients() {
    let l = Linear::new(3, 2, true).unwrap();
    set(&l.weight, &[1.0, 2.0, 3.0, -1.0, 0.5, 0.0]);
    set(l.bias.as_ref().unwrap(), &[0.5, -2.0]);
    let x = t(&[1.0, 1.0, 1.0, 2.0, 0.0, -1.0], &[2, 3]);
    let y = l.forward(&x).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![6.5, -2.5, -0.5, -4.0]);
    y.sum_all().unwrap().backward().unwrap();
    // d(sum)/dW[o, i] = sum over rows of x[:, i]; d/db = rows.
    assert_eq!(
        l.weight.grad().unwrap().to_vec::<f32>().unwrap(),
        vec![3.0, 1.0, 0.0, 3.0, 1.0, 0.0]
    );
    assert_eq!(
        l.bias
            .as_ref()
            .unwrap()
            .grad()
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![2.0, 2.0]
    );
    let bad = l.forward(&t(&[1.0; 4], &[1, 4])).unwrap_err();
    assert!(
        matches!(
            bad,
            Error::Input {
                layer: "Linear",
                ..
            }
        ),
        "{bad}"
    );
    assert!(bad.to_string().contains("in_features = 3"), "{bad}");
}

#[test]
fn mlp_names_and_dropout_modes() {
    manual_seed(1);
    let mut m = mlp(&[4, 8, 2], 0.5).unwrap();
    let names: Vec<String> = m.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["0.weight", "0.bias", "3.weight", "3.bias"]);
    assert!(m.named_buffers().is_empty());
    let d = Dropout::new(0.5).unwrap();
    let x = Tensor::ones(&[1000], DType::F32, Device::Cpu).unwrap();
    let y = d.forward(&x).unwrap().to_vec::<f32>().unwrap();
    let zeros = y.iter().filter(|&&v| v == 0.0).count();
    assert!(y.iter().all(|&v| v == 0.0 || v == 2.0));
    assert!((400..600).contains(&zeros), "{zeros}");
    m.eval();
    assert!(!m.get(2).unwrap().is_training());
    let x = Tensor::randn(&[3, 4], DType::F32, Device::Cpu).unwrap();
    let a = m.forward(&x).unwrap().to_vec::<f32>().unwrap();
    let b = m.forward(&x).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(a, b, "eval-mode dropout must be the identity");
    assert!(Dropout::new(1.0).is_err());
}

#[derive(serde::Deserialize)]
struct MhaFixture {
    in_proj_weight: Vec<f32>,
    in_proj_bias: Vec<f32>,
    out_proj_weight: Vec<f32>,
    out_proj_bias: Vec<f32>,
    shape: Vec<usize>,
    heads: usize,
    x: Vec<f32>,
    key_padding_mask: Vec<bool>,
    plain: Vec<f32>,
    causal_and_padding: Vec<f32>,
}

fn close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol, "element {i}: {g} vs {w}");
    }
}

#[test]
fn multihead_attention_matches_pytorch_with_causal_and_padding_masks() {
    let f: MhaFixture = serde_json::from_str(include_str!("fixtures/mha_parity.json")).unwrap();
    let (b, tt, e) = (f.shape[0], f.shape[1], f.shape[2]);
    let mut mha = MultiheadAttention::new(e, f.heads, 0.0).unwrap();
    mha.eval();
    set(&mha.in_proj_weight, &f.in_proj_weight);
    set(&mha.in_proj_bias, &f.in_proj_bias);
    set(&mha.out_proj.weight, &f.out_proj_weight);
    set(mha.out_proj.bias.as_ref().unwrap(), &f.out_proj_bias);
    let x = t(&f.x, &[b, tt, e]);
    close(
        &mha.forward(&x).unwrap().to_vec::<f32>().unwrap(),
        &f.plain,
        1e-5,
    );
    let pad: Vec<f32> = f.key_padding_mask.iter().map(|&p| p as u8 as f32).collect();
    let pad = t(&pad, &[b, tt]).gt_scalar(0.5).unwrap();
    let masks = AttentionMasks {
        key_padding_mask: Some(&pad),
        is_causal: true,
        ..Default::default()
    };
    let y = mha.attend(&x, &x, &x, masks).unwrap();
    close(&y.to_vec::<f32>().unwrap(), &f.causal_and_padding, 1e-5);
    // Gradients reach the packed projection.
    y.sum_all().unwrap().backward().unwrap();
    assert!(mha.in_proj_weight.grad().is_some());
    let names: Vec<String> = mha.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "in_proj_weight",
            "in_proj_bias",
            "out_proj.weight",
            "out_proj.bias"
        ]
    );
}
