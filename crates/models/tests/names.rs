//! Parameter and buffer names, shapes, dtypes and order match torchvision's state dicts.

use kiln_autograd::{manual_seed, DType, Module};
use kiln_models::layers::{Conv2d, Conv2dConfig, Linear};
use kiln_models::models::resnet18;
use kiln_models::LayerExt;

fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float32",
        DType::I64 => "int64",
        _ => "other",
    }
}

#[test]
fn resnet18_state_dict_matches_torchvision_key_for_key() {
    manual_seed(0);
    let m = resnet18(1000).unwrap();
    let want: Vec<(String, Vec<usize>, String)> =
        serde_json::from_str(include_str!("fixtures/resnet18_state_dict.json")).unwrap();
    let got: Vec<(String, Vec<usize>, String)> = m
        .state_dict()
        .into_iter()
        .map(|(n, t)| (n, t.shape().to_vec(), dtype_name(t.dtype()).to_string()))
        .collect();
    assert_eq!(got.len(), 122);
    assert_eq!(got, want);
    let params: usize = m.parameters().iter().map(|p| p.numel()).sum();
    assert_eq!(params, 11_689_512);
    let buffers = m.named_buffers();
    assert_eq!(buffers.len(), 60);
    assert_eq!(buffers[0].0, "bn1.running_mean");
    assert!(m
        .named_parameters()
        .iter()
        .any(|(n, _)| n == "layer2.0.downsample.0.weight"));
}

#[test]
fn default_inits_follow_pytorch_bounds() {
    manual_seed(3);
    let l = Linear::new(300, 200, true).unwrap();
    let bound = 1.0 / 300f64.sqrt();
    let w = l.weight.to_vec_f64().unwrap();
    assert!(w.iter().all(|v| v.abs() <= bound));
    // U(-b, b) has standard deviation b / sqrt(3).
    let var = w.iter().map(|v| v * v).sum::<f64>() / w.len() as f64;
    assert!(
        (var.sqrt() / (bound / 3f64.sqrt()) - 1.0).abs() < 0.02,
        "{var}"
    );
    let b = l.bias.as_ref().unwrap().to_vec_f64().unwrap();
    assert!(b.iter().all(|v| v.abs() <= bound) && b.iter().any(|v| v.abs() > bound / 2.0));

    let c = Conv2d::new(16, 8, 3, Conv2dConfig::default()).unwrap();
    let cb = 1.0 / (16.0f64 * 9.0).sqrt();
    assert!(c.weight.to_vec_f64().unwrap().iter().all(|v| v.abs() <= cb));

    // torchvision's ResNet conv init: N(0, 2 / fan_out); fan_out of layer1 convs = 64 * 9.
    let m = resnet18(10).unwrap();
    let w = m
        .named_parameters()
        .into_iter()
        .find(|(n, _)| n == "layer1.0.conv1.weight")
        .unwrap()
        .1
        .to_vec_f64()
        .unwrap();
    let std = (w.iter().map(|v| v * v).sum::<f64>() / w.len() as f64).sqrt();
    assert!((std / (2.0f64 / 576.0).sqrt() - 1.0).abs() < 0.03, "{std}");
    let bn: Vec<(String, kiln_autograd::Tensor)> = m.state_dict();
    let get = |k: &str| {
        bn.iter()
            .find(|(n, _)| n == k)
            .unwrap()
            .1
            .to_vec_f64()
            .unwrap()
    };
    assert!(get("bn1.weight").iter().all(|&v| v == 1.0));
    assert!(get("bn1.bias").iter().all(|&v| v == 0.0));
    assert!(get("bn1.running_var").iter().all(|&v| v == 1.0));
    assert_eq!(get("bn1.num_batches_tracked"), vec![0.0]);
}
