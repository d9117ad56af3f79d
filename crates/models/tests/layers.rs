//! Layer forward passes that run on kiln-autograd's core ops, against hand values and PyTorch.

use kiln_autograd::{manual_seed, DType, Device, Module, Tensor};
use kiln_models::layers::{AttentionMasks, BatchNorm2d, Dropout, Linear, MultiheadAttention};
use kiln_models::models::mlp;
use kiln_models::{set_batch_stats_reduce, BatchStatsReduce, Error, Layer, LayerExt};
use std::sync::Arc;

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
    // A hostile p is echoed in short form, not as 301 digits.
    let e = Dropout::new(-1e300).unwrap_err().to_string();
    assert!(e.contains("p = -1e300 must"), "{e}");
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
    float_mask: Vec<f32>,
    float_masked: Vec<f32>,
}

fn close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol, "element {i}: {g} vs {w}");
    }
}

#[test]
fn a_key_padding_mask_or_keys_of_the_wrong_shape_are_refused() {
    let mha = MultiheadAttention::new(4, 2, 0.0).unwrap();
    let x = Tensor::zeros(&[2, 3, 4], DType::F32, Device::Cpu).unwrap();
    let bool_of = |shape: &[usize]| {
        Tensor::zeros(shape, DType::F32, Device::Cpu)
            .unwrap()
            .gt_scalar(0.5)
            .unwrap()
    };
    let floats = Tensor::zeros(&[2, 3], DType::F32, Device::Cpu).unwrap();
    for (mask, what) in [
        (bool_of(&[3, 2]), "bool [3, 2]"),
        (bool_of(&[2, 3, 1]), "bool [2, 3, 1]"),
        (floats, "float32 [2, 3]"),
    ] {
        let masks = AttentionMasks {
            key_padding_mask: Some(&mask),
            ..Default::default()
        };
        let e = mha.attend(&x, &x, &x, masks).unwrap_err().to_string();
        assert!(
            e.contains("key_padding_mask must be a bool [2, 3] tensor"),
            "{what}: {e}"
        );
    }
    // Keys and values of another batch size than the query's are refused by name, too.
    let other_batch = Tensor::zeros(&[1, 3, 4], DType::F32, Device::Cpu).unwrap();
    let e = mha
        .attend(&x, &other_batch, &other_batch, AttentionMasks::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("expected batch-first query [B, T, 4]"), "{e}");
    // The right mask is taken.
    let masks = AttentionMasks {
        key_padding_mask: Some(&bool_of(&[2, 3])),
        ..Default::default()
    };
    assert_eq!(mha.attend(&x, &x, &x, masks).unwrap().shape(), [2, 3, 4]);
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
    // A float attn_mask is added to the scores.
    let bias = t(&f.float_mask, &[tt, tt]);
    let biased = AttentionMasks {
        attn_mask: Some(&bias),
        ..Default::default()
    };
    let z = mha.attend(&x, &x, &x, biased).unwrap();
    close(&z.to_vec::<f32>().unwrap(), &f.float_masked, 1e-5);
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

/// The batch-statistics reduction of a group of one: the sum over the participants is the
/// local value.
#[derive(Debug)]
struct OneParticipant;

impl BatchStatsReduce for OneParticipant {
    fn sum(&self, local: &Tensor) -> kiln_models::Result<Tensor> {
        Ok(local.clone())
    }
}

#[test]
fn batch_norm_reduced_over_one_participant_equals_the_plain_layer() {
    manual_seed(5);
    let plain = BatchNorm2d::new(3).unwrap();
    let mut synced = BatchNorm2d::new(3).unwrap();
    assert_eq!(
        set_batch_stats_reduce(&mut synced, Some(Arc::new(OneParticipant))),
        1
    );
    let values = |t: &Tensor| t.to_vec_f64().unwrap();
    let close64 = |a: &[f64], b: &[f64], what: &str| {
        assert_eq!(a.len(), b.len(), "{what}");
        for (x, y) in a.iter().zip(b) {
            assert!(
                (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
                "{what}: {x} vs {y}"
            );
        }
    };
    // Two training steps on [4, 3, 2, 2] inputs of mean 2 and spread 3: outputs and running
    // statistics (the unbiased variance, blended with momentum 0.1) agree.
    for _ in 0..2 {
        let x = Tensor::randn(&[4, 3, 2, 2], DType::F32, Device::Cpu)
            .unwrap()
            .mul_scalar(3.0)
            .unwrap()
            .add_scalar(2.0)
            .unwrap();
        close64(
            &values(&synced.forward(&x).unwrap()),
            &values(&plain.forward(&x).unwrap()),
            "output",
        );
    }
    close64(
        &values(&synced.running_mean),
        &values(&plain.running_mean),
        "mean",
    );
    close64(
        &values(&synced.running_var),
        &values(&plain.running_var),
        "var",
    );
    // The statistics moved: 0.19 of the way to means near 2 and variances near 9.
    assert!(values(&plain.running_mean).iter().all(|m| *m > 0.1));
    assert!(values(&plain.running_var).iter().all(|v| *v > 1.5));
    for bn in [&plain, &synced] {
        assert_eq!(bn.num_batches_tracked.to_vec::<i64>().unwrap(), [2]);
    }
    // Evaluation counts no batch and moves no statistic.
    let x = Tensor::randn(&[2, 3, 2, 2], DType::F32, Device::Cpu).unwrap();
    for mut bn in [plain, synced] {
        let (mean, var) = (values(&bn.running_mean), values(&bn.running_var));
        bn.eval();
        bn.forward(&x).unwrap();
        assert_eq!(bn.num_batches_tracked.to_vec::<i64>().unwrap(), [2]);
        assert_eq!(values(&bn.running_mean), mean);
        assert_eq!(values(&bn.running_var), var);
        // In training, one value per channel has no variance: refused, by both.
        bn.train(true);
        let one = Tensor::ones(&[1, 3, 1, 1], DType::F32, Device::Cpu).unwrap();
        let e = bn.forward(&one).unwrap_err().to_string();
        assert!(e.contains("more than 1 value per channel"), "{e}");
    }
}
