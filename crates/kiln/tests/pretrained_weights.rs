//! Pretrained torchvision weights, from a file PyTorch wrote (tests/fixtures/make_pretrained.py:
//! torchvision's ResNet-18 at base width 4, 7 classes, randomised BatchNorm statistics): the
//! `.pth` loads strictly and gives PyTorch's logits, its safetensors conversion gives the same
//! logits bit for bit, and the fine-tune loader refuses a file of another kind of ResNet naming
//! the keys that did not match.

use kiln::autograd::{Device, Tensor};
use kiln::models::{load_pth, load_safetensors, Layer, LayerExt};
use kiln::recipe::model::{load_pretrained, pretrained_dims, read_pretrained};
use kiln::recipe::{Arch, ModelConfig};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn config(arch: Arch, num_classes: usize) -> ModelConfig {
    ModelConfig {
        in_channels: 3,
        image_size: [32, 32],
        num_classes,
        width: 4,
        blocks: arch.torchvision_blocks().unwrap(),
        arch,
    }
}

/// The fixture's input, x[i] = cos(0.37 i) computed in f64 and rounded to f32, and PyTorch's
/// eval-mode logits for it.
fn input_and_logits() -> (Tensor, Vec<Vec<f64>>) {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("resnet18_w4_logits.json")).unwrap())
            .unwrap();
    let shape: Vec<usize> = serde_json::from_value(json["input_shape"].clone()).unwrap();
    let n: usize = shape.iter().product();
    let x: Vec<f32> = (0..n).map(|i| (0.37 * i as f64).cos() as f32).collect();
    let logits = serde_json::from_value(json["logits"].clone()).unwrap();
    (Tensor::from_vec(x, &shape, Device::Cpu).unwrap(), logits)
}

fn eval_logits(model: &mut dyn Layer, x: &Tensor) -> Vec<f32> {
    model.eval();
    kiln::autograd::no_grad(|| model.forward(x).unwrap().to_vec::<f32>().unwrap())
}

#[test]
fn pytorch_pth_loads_strictly_and_gives_pytorchs_logits_as_does_its_safetensors_copy() {
    let pth = fixture("resnet18_w4.pth");
    let tensors = read_pretrained(&pth).unwrap();
    let dims = pretrained_dims(&tensors, Arch::ResNet18, &pth).unwrap();
    assert_eq!((dims.width, dims.in_channels), (4, 3));

    let mut model = config(Arch::ResNet18, 7).build().unwrap();
    let report = load_pth(&model, &pth, true).unwrap();
    assert!(report.is_exact());
    // torchvision's ResNet-18: 62 parameters and 60 BatchNorm buffers.
    assert_eq!(report.loaded.len(), 122);
    let (x, want) = input_and_logits();
    let got = eval_logits(&mut model, &x);
    assert_eq!(got.len(), 2 * 7);
    // f32 throughout; kiln and PyTorch sum the convolutions in different orders. The logits
    // are 0.03 to 0.3 in size; they agree to 1e-7 today, 1e-6 leaves room for other kernels.
    for (i, (g, w)) in got.iter().zip(want.iter().flatten()).enumerate() {
        assert!(
            (*g as f64 - w).abs() < 1e-6,
            "logit {i}: kiln {g}, PyTorch {w}"
        );
    }

    let dir = std::env::temp_dir().join(format!("kiln-pretrained-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let st = dir.join("resnet18_w4.safetensors");
    kiln::models::pth::convert_to_safetensors(&pth, &st).unwrap();
    let mut from_st = config(Arch::ResNet18, 7).build().unwrap();
    assert!(load_safetensors(&from_st, &st, true).unwrap().is_exact());
    let got_st = eval_logits(&mut from_st, &x);
    assert_eq!(
        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        got_st.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    // The fine-tune reader takes either file and finds the same tensors.
    let via_st = read_pretrained(&st).unwrap();
    assert_eq!(via_st.len(), tensors.len());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_backbone_loads_into_a_new_head_and_the_file_head_is_reported_dropped() {
    let pth = fixture("resnet18_w4.pth");
    let tensors = read_pretrained(&pth).unwrap();
    let model = config(Arch::ResNet18, 10).build().unwrap();
    let head_before = model.fc.weight.to_vec::<f32>().unwrap();
    let report = load_pretrained(&model, &tensors, Arch::ResNet18, &pth).unwrap();
    assert_eq!(report.loaded, 120);
    assert_eq!(
        report.dropped_head,
        vec![
            ("fc.weight".to_string(), vec![7, 32]),
            ("fc.bias".to_string(), vec![7]),
        ]
    );
    assert_eq!(model.fc.weight.to_vec::<f32>().unwrap(), head_before);
    let file: std::collections::HashMap<_, _> = tensors.into_iter().collect();
    for (name, t) in model.state_dict() {
        if !name.starts_with("fc.") {
            assert_eq!(
                t.to_vec_f64().unwrap(),
                file[&name].to_vec_f64().unwrap(),
                "{name}"
            );
        }
    }
}

#[test]
fn a_file_of_another_resnet_is_refused_naming_the_keys_that_did_not_match() {
    let pth = fixture("resnet18_w4.pth");
    let tensors = read_pretrained(&pth).unwrap();
    let deeper = config(Arch::ResNet34, 10).build().unwrap();
    let untouched = deeper.conv1.weight.to_vec::<f32>().unwrap();
    let msg = load_pretrained(&deeper, &tensors, Arch::ResNet34, &pth)
        .unwrap_err()
        .to_string();
    for want in [
        "is not a torchvision resnet34 state dict",
        "backbone keys of the model are not in the file (layer1.2.conv1.weight",
        "--model",
    ] {
        assert!(msg.contains(want), "{want:?} not in {msg}");
    }
    assert_eq!(deeper.conv1.weight.to_vec::<f32>().unwrap(), untouched);

    let bottleneck = config(Arch::ResNet50, 10).build().unwrap();
    let msg = load_pretrained(&bottleneck, &tensors, Arch::ResNet50, &pth)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("layer1.0.conv3.weight"), "{msg}");

    // The CIFAR stem is 3x3: the 7x7 file is not one.
    let msg = pretrained_dims(&tensors, Arch::CifarResNet, &pth)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("conv1.weight has shape [4, 3, 7, 7]"), "{msg}");
}
