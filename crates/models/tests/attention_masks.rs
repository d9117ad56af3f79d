//! `MultiheadAttention`'s masks against PyTorch (`fixtures/mha_masks_parity.json`, made by
//! `fixtures/gen_mha_masks.py`): a 3-D `attn_mask` in PyTorch's `[B * num_heads, T, S]`
//! layout, and query rows whose every key is masked, which attend to nothing (output: the
//! output projection's bias; gradients 0, not NaN), as PyTorch's `need_weights=False` path.

use kiln_autograd::{DType, Device, NoGradGuard, Tensor};
use kiln_models::layers::{AttentionMasks, MultiheadAttention};

#[derive(serde::Deserialize)]
struct Outputs {
    out: Vec<f32>,
    grad_x: Vec<f32>,
    grad_in_proj_weight: Vec<f32>,
}

#[derive(serde::Deserialize)]
struct Fixture {
    shape: Vec<usize>,
    heads: usize,
    in_proj_weight: Vec<f32>,
    in_proj_bias: Vec<f32>,
    out_proj_weight: Vec<f32>,
    out_proj_bias: Vec<f32>,
    x: Vec<f32>,
    w: Vec<f32>,
    attn_mask: Vec<bool>,
    key_padding_mask: Vec<bool>,
    masked: Outputs,
    padded: Outputs,
}

fn t(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape, Device::Cpu).unwrap()
}

fn mask(v: &[bool], shape: &[usize]) -> Tensor {
    let f: Vec<f32> = v.iter().map(|&b| b as u8 as f32).collect();
    t(&f, shape).gt_scalar(0.5).unwrap()
}

fn close(what: &str, got: &Tensor, want: &[f32]) {
    let got = got.to_vec::<f32>().unwrap();
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-5, "{what}[{i}]: kiln {g}, PyTorch {w}");
    }
}

fn fixture() -> (Fixture, MultiheadAttention) {
    let f: Fixture = serde_json::from_str(include_str!("fixtures/mha_masks_parity.json")).unwrap();
    let mha = MultiheadAttention::new(f.shape[2], f.heads, 0.0).unwrap();
    let _g = NoGradGuard::new();
    let bias = mha.out_proj.bias.as_ref().unwrap();
    for (p, v) in [
        (&mha.in_proj_weight, &f.in_proj_weight),
        (&mha.in_proj_bias, &f.in_proj_bias),
        (&mha.out_proj.weight, &f.out_proj_weight),
        (bias, &f.out_proj_bias),
    ] {
        p.copy_(&t(v, p.shape())).unwrap();
    }
    (f, mha)
}

/// Attends with `masks`, backward of `sum(out * w)`, and compares with PyTorch's outputs;
/// returns kiln's output.
fn check(
    f: &Fixture,
    mha: &MultiheadAttention,
    masks: AttentionMasks<'_>,
    want: &Outputs,
) -> Vec<f32> {
    let x = t(&f.x, &f.shape).set_requires_grad(true).unwrap();
    let out = mha.attend(&x, &x, &x, masks).unwrap();
    close("output", &out, &want.out);
    let loss = out.mul(&t(&f.w, &f.shape)).unwrap().sum_all().unwrap();
    loss.backward().unwrap();
    close("d/dx", &x.grad().unwrap(), &want.grad_x);
    close(
        "d/d in_proj_weight",
        &mha.in_proj_weight.grad().unwrap(),
        &want.grad_in_proj_weight,
    );
    out.to_vec::<f32>().unwrap()
}

#[test]
fn a_3d_attn_mask_is_batch_major_per_head_and_a_blocked_row_attends_to_nothing() {
    let (f, mha) = fixture();
    let (b, tt, h) = (f.shape[0], f.shape[1], f.heads);
    let m = mask(&f.attn_mask, &[b * h, tt, tt]);
    let masks = AttentionMasks {
        attn_mask: Some(&m),
        ..Default::default()
    };
    check(&f, &mha, masks, &f.masked);
}

#[test]
fn a_batch_element_with_every_key_padded_gets_the_output_bias_and_no_gradient() {
    let (f, mha) = fixture();
    let pad = mask(&f.key_padding_mask, &[f.shape[0], f.shape[1]]);
    let masks = AttentionMasks {
        key_padding_mask: Some(&pad),
        ..Default::default()
    };
    let out = check(&f, &mha, masks, &f.padded);
    // kiln's rows of the second batch element are the bias exactly, as PyTorch's are.
    let e = f.shape[2];
    for rows in [&out, &f.padded.out] {
        for row in rows[f.shape[1] * e..].chunks(e) {
            assert_eq!(row, &f.out_proj_bias[..]);
        }
    }
}

#[test]
fn a_3d_attn_mask_of_another_layout_is_refused_by_name() {
    let mha = MultiheadAttention::new(4, 2, 0.0).unwrap();
    let x = Tensor::zeros(&[3, 5, 4], DType::F32, Device::Cpu).unwrap();
    // [B, T, S] (one mask per batch element) with B = 3: PyTorch's layout is [B * H, T, S].
    let per_batch = Tensor::zeros(&[3, 5, 5], DType::Bool, Device::Cpu).unwrap();
    let masks = AttentionMasks {
        attn_mask: Some(&per_batch),
        ..Default::default()
    };
    let e = mha.attend(&x, &x, &x, masks).unwrap_err().to_string();
    assert!(
        e.contains("a 3-D attn_mask is PyTorch's [B * num_heads, T, S] = [6, 5, 5], got [3, 5, 5]")
            && e.contains("[1, 2, 5, 5]"),
        "{e}"
    );
    // A mask that would enlarge the scores ([2, ...] against B = 3) is refused, naming the
    // layouts taken.
    let wide = Tensor::zeros(&[2, 1, 5, 5], DType::Bool, Device::Cpu).unwrap();
    let masks = AttentionMasks {
        attn_mask: Some(&wide),
        ..Default::default()
    };
    let e = mha.attend(&x, &x, &x, masks).unwrap_err().to_string();
    assert!(
        e.contains("attn_mask of shape [2, 1, 5, 5] does not fit the scores")
            && e.contains("[3, 2, 5, 5]"),
        "{e}"
    );
}
