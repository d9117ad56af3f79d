//! Forward passes against PyTorch: files written by Python loaded into kiln give torchvision's
//! logits; encoder layers match `nn.TransformerEncoderLayer`; training-mode BatchNorm updates its
//! buffers; a frozen backbone gets no gradient.

mod common;

use kiln_autograd::{manual_seed, DType, Device, Module, Tensor};
use kiln_models::layers::{
    Activation, AttentionMasks, BatchNorm2d, Conv2d, Conv2dConfig, Flatten, Linear, MaxPool2d,
    ReLU, Sequential, TransformerEncoderLayer, TransformerEncoderLayerConfig,
};
use kiln_models::models::{Gpt, GptConfig, VisionTransformer, VitConfig};
use kiln_models::{load_safetensors, plan, Freeze, Layer, LayerExt, OptimizerKind};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

/// Writes an embedded fixture to a temporary file and returns its path: the fixtures travel
/// inside the test binary, so it also runs where the source tree is absent (the GPU machine).
fn embedded(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-models-forward-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[derive(serde::Deserialize)]
struct Logits {
    input_shape: Vec<usize>,
    logits_shape: Vec<usize>,
    logits: Vec<f32>,
}

fn read_logits(name: &str) -> Logits {
    let text = match name {
        "small_convnet" => include_str!("fixtures/small_convnet_logits.json").to_string(),
        "vit_tiny" => include_str!("fixtures/vit_tiny_logits.json").to_string(),
        "resnet_tiny_formula" => {
            include_str!("fixtures/resnet_tiny_formula_logits.json").to_string()
        }
        // Generated on demand (not committed), so read at run time.
        _ => std::fs::read_to_string(format!("{FIXTURES}/{name}_logits.json")).unwrap(),
    };
    serde_json::from_str(&text).unwrap()
}

/// `cos(0.37 i)`, the input gen_fixtures.py feeds every model.
fn fixed_input(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| (0.37 * i as f64).cos() as f32).collect();
    Tensor::from_vec(v, shape, Device::Cpu).unwrap()
}

fn assert_close(got: &[f32], want: &[f32], rel: f32) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= rel * w.abs().max(1.0),
            "element {i}: kiln {g} vs torch {w}"
        );
    }
}

fn check_logits(model: &mut dyn Layer, name: &str) {
    let f = read_logits(name);
    model.eval();
    let y = model.forward(&fixed_input(&f.input_shape)).unwrap();
    assert_eq!(y.shape(), &f.logits_shape[..]);
    assert_close(&y.to_vec::<f32>().unwrap(), &f.logits, 1e-4);
}

#[test]
fn small_convnet_written_by_python_gives_torchs_logits() {
    let mut m = Sequential::new()
        .push(Conv2d::new(3, 4, 3, Conv2dConfig::default().padding(1)).unwrap())
        .push(BatchNorm2d::new(4).unwrap())
        .push(ReLU::new())
        .push(MaxPool2d::new(2, 2, 0).unwrap())
        .push(Flatten::new())
        .push(Linear::new(16 * 4, 3, true).unwrap());
    let bytes = include_bytes!("fixtures/small_convnet.safetensors");
    load_safetensors(&m, embedded("small_convnet.safetensors", bytes), true).unwrap();
    check_logits(&mut m, "small_convnet");
}

#[test]
fn vit_tiny_written_by_torchvision_gives_its_logits() {
    let mut m = VisionTransformer::new(VitConfig::tiny(10)).unwrap();
    let bytes = include_bytes!("fixtures/vit_tiny.safetensors");
    load_safetensors(&m, embedded("vit_tiny.safetensors", bytes), true).unwrap();
    check_logits(&mut m, "vit_tiny");
}

/// gen_fixtures.py's `formula_fill`: entry `i` of state-dict tensor number `k`.
fn formula_fill(m: &dyn Layer) {
    let _g = kiln_autograd::NoGradGuard::new();
    for (k, (name, t)) in m.state_dict().into_iter().enumerate() {
        if name.ends_with("num_batches_tracked") {
            t.fill_(3.0).unwrap();
            continue;
        }
        let fan_in: usize = t.shape().iter().skip(1).product();
        let v: Vec<f32> = (0..t.numel())
            .map(|i| {
                let s = (0.7 * i as f64 + 1.3 * k as f64).sin();
                (if t.rank() > 1 {
                    s / (fan_in as f64).sqrt()
                } else if name.ends_with("running_var") {
                    1.0 + 0.5 * s.abs()
                } else if name.ends_with("weight") {
                    1.0 + 0.2 * s
                } else {
                    0.1 * s
                }) as f32
            })
            .collect();
        t.copy_(&Tensor::from_vec(v, t.shape(), Device::Cpu).unwrap())
            .unwrap();
    }
}

#[test]
fn torchvision_resnet_architecture_gives_torchvisions_logits() {
    let mut m = common::tiny_resnet(10, false);
    formula_fill(&m);
    check_logits(&mut m, "resnet_tiny_formula");
}

/// ReLU and the residual sums write over what they are handed, never over what the caller still
/// holds: the input is unchanged, and the logits under `no_grad` (every ReLU and sum in place)
/// are those of a pass recording a graph, bit for bit.
#[test]
fn in_place_activations_never_touch_what_the_caller_holds() {
    let mut m = common::tiny_resnet(10, false);
    formula_fill(&m);
    m.eval();
    let x = fixed_input(&read_logits("resnet_tiny_formula").input_shape);
    let before = x.to_vec::<f32>().unwrap();
    let recorded = m.forward(&x).unwrap();
    assert!(recorded.requires_grad());
    let inference = kiln_autograd::no_grad(|| m.forward(&x)).unwrap();
    let bits = |t: &Tensor| -> Vec<u32> {
        t.to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    assert_eq!(bits(&recorded), bits(&inference));
    assert_eq!(x.to_vec::<f32>().unwrap(), before);
    // A Sequential whose first layer is a ReLU gets the caller's tensor.
    let s = Sequential::new().push(ReLU::new()).push(ReLU::new());
    let y = kiln_autograd::no_grad(|| s.forward(&x)).unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), before);
    assert_eq!(bits(&y), bits(&x.relu().unwrap()));
}

#[test]
fn full_resnet18_checkpoint_from_torchvision_when_generated() {
    let path = format!("{FIXTURES}/resnet18.safetensors");
    if !std::path::Path::new(&path).exists() {
        println!("skipped: {path} absent (46 MB, not committed); run gen_fixtures.py --full");
        return;
    }
    let mut m = kiln_models::models::resnet18(1000).unwrap();
    load_safetensors(&m, &path, true).unwrap();
    check_logits(&mut m, "resnet18");
}

#[derive(serde::Deserialize)]
struct EncoderCase {
    params: std::collections::HashMap<String, Vec<f32>>,
    y: Vec<f32>,
}

#[derive(serde::Deserialize)]
struct EncoderFixture {
    shape: Vec<usize>,
    heads: usize,
    dim_feedforward: usize,
    x: Vec<f32>,
    key_padding_mask: Vec<bool>,
    pre: EncoderCase,
    post: EncoderCase,
}

#[test]
fn transformer_encoder_layer_matches_pytorch_pre_and_post_norm() {
    let f: EncoderFixture =
        serde_json::from_str(include_str!("fixtures/encoder_layer_parity.json")).unwrap();
    let (b, t, d) = (f.shape[0], f.shape[1], f.shape[2]);
    let x = Tensor::from_slice(&f.x, &[b, t, d], Device::Cpu).unwrap();
    let pad: Vec<f32> = f.key_padding_mask.iter().map(|&p| p as u8 as f32).collect();
    let pad = Tensor::from_vec(pad, &[b, t], Device::Cpu)
        .unwrap()
        .gt_scalar(0.5)
        .unwrap();
    for (norm_first, case) in [(false, &f.post), (true, &f.pre)] {
        let mut layer = TransformerEncoderLayer::new(TransformerEncoderLayerConfig {
            dim_feedforward: f.dim_feedforward,
            dropout: 0.0,
            activation: Activation::Gelu,
            norm_first,
            ..TransformerEncoderLayerConfig::new(d, f.heads)
        })
        .unwrap();
        layer.eval();
        let tensors: Vec<(String, Tensor)> = layer
            .state_dict()
            .into_iter()
            .map(|(n, p)| {
                let v = &case.params[&n];
                (n, Tensor::from_slice(v, p.shape(), Device::Cpu).unwrap())
            })
            .collect();
        assert!(
            kiln_models::checkpoint::load_state_dict(&layer, &tensors, true)
                .unwrap()
                .is_exact()
        );
        let masks = AttentionMasks {
            key_padding_mask: Some(&pad),
            is_causal: true,
            ..Default::default()
        };
        let y = layer.forward_masked(&x, masks).unwrap();
        assert_close(&y.to_vec::<f32>().unwrap(), &case.y, 1e-4);
    }
}

#[test]
fn batchnorm_training_updates_running_statistics() {
    let bn = BatchNorm2d::new(2).unwrap();
    // Channel 0 holds 1..=4, channel 1 holds 10 x 4: batch 2, 1x2 spatial.
    let x = Tensor::from_vec(
        vec![1.0f32, 2.0, 10.0, 10.0, 3.0, 4.0, 10.0, 10.0],
        &[2, 2, 1, 2],
        Device::Cpu,
    )
    .unwrap();
    let y = bn.forward(&x).unwrap().to_vec::<f32>().unwrap();
    // Channel 0: mean 2.5, biased var 1.25.
    let z = |v: f32| (v - 2.5) / (1.25f32 + 1e-5).sqrt();
    assert_close(
        &[y[0], y[1], y[4], y[5]],
        &[z(1.0), z(2.0), z(3.0), z(4.0)],
        1e-5,
    );
    assert_close(&[y[2], y[3]], &[0.0, 0.0], 1e-6);
    // Running: 0.9 * old + 0.1 * batch (unbiased var 5/3 for channel 0, 0 for channel 1).
    assert_close(
        &bn.running_mean.to_vec::<f32>().unwrap(),
        &[0.25, 1.0],
        1e-6,
    );
    assert_close(
        &bn.running_var.to_vec::<f32>().unwrap(),
        &[0.9 + 0.1 * 5.0 / 3.0, 0.9],
        1e-6,
    );
    assert_eq!(bn.num_batches_tracked.to_vec::<i64>().unwrap(), vec![1]);
}

#[test]
fn a_frozen_resnet_backbone_gets_no_gradient_and_saves_less() {
    manual_seed(9);
    let m = common::tiny_resnet(5, true);
    let full = plan(&m, &[3, 16, 16], DType::F32, OptimizerKind::AdamW).unwrap();
    m.freeze(|n| !n.starts_with("fc.")).unwrap();
    let frozen = plan(&m, &[3, 16, 16], DType::F32, OptimizerKind::AdamW).unwrap();
    let x = Tensor::randn(&[2, 3, 16, 16], DType::F32, Device::Cpu).unwrap();
    common::assert_only_head_gets_gradients(&m, &x, "fc.");
    // Only fc's input (the pooled features, 512 floats per sample) is kept.
    assert_eq!(frozen.saved_activation_bytes_per_sample, 512 * 4);
    assert!(
        full.saved_activation_bytes_per_sample > 100 * frozen.saved_activation_bytes_per_sample
    );
    assert_eq!(frozen.optimizer_state_bytes, 2 * (512 * 5 + 5) * 4);
}

#[test]
fn gpt_is_causal_and_trains_its_embeddings() {
    manual_seed(4);
    let g = Gpt::new(GptConfig::tiny()).unwrap();
    let ids = |v: Vec<i64>| Tensor::from_vec(v, &[1, 6], Device::Cpu).unwrap();
    let a = g.forward(&ids(vec![1, 2, 3, 4, 5, 6])).unwrap();
    let b = g.forward(&ids(vec![1, 2, 3, 9, 9, 9])).unwrap();
    assert_eq!(a.shape(), &[1, 6, 64]);
    let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    assert_close(&a[..3 * 64], &b[..3 * 64], 1e-6);
    assert!(a[3 * 64..]
        .iter()
        .zip(&b[3 * 64..])
        .any(|(x, y)| (x - y).abs() > 1e-4));
    let loss = g
        .forward(&ids(vec![1, 2, 3, 4, 5, 6]))
        .unwrap()
        .mean_all()
        .unwrap();
    loss.backward().unwrap();
    assert!(g.wte.weight.grad().is_some() && g.h.get(1).is_some());
}
