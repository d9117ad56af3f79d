//! safetensors checkpoints: round trips, strict and non-strict loads, files written by PyTorch,
//! and kiln files loaded by torchvision.

mod common;

use kiln_autograd::{manual_seed, Module, Tensor};
use kiln_models::checkpoint::{load_state_dict, load_tensors};
use kiln_models::layers::Sequential;
use kiln_models::layers::{BatchNorm2d, Conv2d, Conv2dConfig, Flatten, Linear, MaxPool2d, ReLU};
use kiln_models::models::{mlp, ResNet, ResNetConfig};
use kiln_models::{load_safetensors, save_safetensors, Error, Layer, LayerExt};
use std::path::PathBuf;

/// A path in a folder of its own per file name: the tests run in parallel threads of one
/// process, and some of them list or plant files beside their checkpoint.
fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir()
        .join(format!("kiln-models-ckpt-{}", std::process::id()))
        .join(name.replace('.', "_"));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn values(m: &dyn Layer) -> Vec<(String, Vec<f64>)> {
    m.state_dict()
        .into_iter()
        .map(|(n, t)| (n, t.to_vec_f64().unwrap()))
        .collect()
}

#[test]
fn round_trip_restores_parameters_and_buffers() {
    manual_seed(1);
    let a = common::tiny_resnet(10, false);
    {
        let _g = kiln_autograd::NoGradGuard::new();
        let (_, nbt) = a
            .named_buffers()
            .into_iter()
            .find(|(n, _)| n.ends_with("num_batches_tracked"))
            .unwrap();
        nbt.fill_(7.0).unwrap();
    }
    let path = tmp("resnet18.safetensors");
    save_safetensors(&a, &path).unwrap();
    manual_seed(2);
    let b = common::tiny_resnet(10, false);
    assert_ne!(values(&a), values(&b));
    let report = load_safetensors(&b, &path, true).unwrap();
    assert!(report.is_exact());
    assert_eq!(report.loaded.len(), a.state_dict().len());
    assert_eq!(report.loaded.len(), 38 + 36);
    assert_eq!(values(&a), values(&b));
    // No temporary file is left beside the checkpoint; overwriting works.
    save_safetensors(&b, &path).unwrap();
    let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty());
}

#[test]
fn strict_load_names_missing_unexpected_and_misshaped_keys() {
    manual_seed(3);
    let small = mlp(&[4, 8, 2], 0.0).unwrap();
    let path = tmp("mlp.safetensors");
    save_safetensors(&small, &path).unwrap();
    let other = mlp(&[4, 8, 3, 5], 0.0).unwrap();
    let err = load_safetensors(&other, &path, true).unwrap_err();
    assert!(matches!(err, Error::StateDict(_)));
    let msg = err.to_string();
    for want in [
        "missing keys: 4.weight, 4.bias",
        "2.weight: model has shape [3, 8], file has [2, 8]",
        "strict = false",
    ] {
        assert!(msg.contains(want), "{want:?} not in {msg}");
    }
    // Without strict the missing keys are no error: the refusal names only the shapes.
    let msg = load_safetensors(&other, &path, false)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("2.weight: model has shape [3, 8]"), "{msg}");
    assert!(!msg.contains("missing keys"), "{msg}");
    // Nothing was copied by the failed loads.
    let before = other.named_parameters()[0].1.to_vec_f64().unwrap();
    assert_ne!(before, small.named_parameters()[0].1.to_vec_f64().unwrap());
    let bigger = mlp(&[4, 8], 0.0).unwrap();
    let err = load_safetensors(&bigger, &path, true)
        .unwrap_err()
        .to_string();
    assert!(err.contains("unexpected keys: 2.bias, 2.weight"), "{err}");
}

#[test]
fn non_strict_loads_a_backbone_into_a_model_with_a_new_head() {
    manual_seed(4);
    let pretrained = common::tiny_resnet(1000, false);
    let path = tmp("backbone.safetensors");
    save_safetensors(&pretrained, &path).unwrap();
    let finetune = ResNet::new(ResNetConfig {
        num_classes: 7,
        ..pretrained.config
    })
    .unwrap();
    let untouched = values(&finetune);

    // The whole file, head included: the head's shapes differ, which PyTorch refuses even
    // with strict=False, and so does kiln, naming each key with both shapes and copying nothing.
    let msg = load_safetensors(&finetune, &path, false)
        .unwrap_err()
        .to_string();
    for want in [
        "fc.weight: model has shape [7, 512], file has [1000, 512]",
        "fc.bias: model has shape [7], file has [1000]",
        "strict=False too",
        "drop the file's head entries",
    ] {
        assert!(msg.contains(want), "{want:?} not in {msg}");
    }
    assert!(!msg.contains("fix the names"), "{msg}");
    assert_eq!(values(&finetune), untouched);

    // The fine-tuning path, as in PyTorch: the file's head entries left out, the rest loaded
    // without strict, the head reported missing and left as initialised.
    let (tensors, _) = load_tensors(&path).unwrap();
    let backbone: Vec<_> = tensors
        .into_iter()
        .filter(|(n, _)| !n.starts_with("fc."))
        .collect();
    let report = load_state_dict(&finetune, &backbone, false).unwrap();
    assert_eq!(report.missing, vec!["fc.weight", "fc.bias"]);
    assert!(report.unexpected.is_empty() && report.mismatched.is_empty());
    assert_eq!(report.loaded.len(), pretrained.state_dict().len() - 2);
    let (p, f) = (values(&pretrained), values(&finetune));
    for ((n, a), (_, b)) in p.iter().zip(&f) {
        assert_eq!(a == b, !n.starts_with("fc."), "{n}");
    }
}

#[test]
fn a_strict_load_failing_only_on_shapes_says_shapes_not_names() {
    manual_seed(5);
    let narrow = mlp(&[4, 8, 2], 0.0).unwrap();
    let path = tmp("narrow.safetensors");
    save_safetensors(&narrow, &path).unwrap();
    let wide = mlp(&[4, 6, 2], 0.0).unwrap();
    let untouched = values(&wide);
    let err = load_safetensors(&wide, &path, true).unwrap_err();
    assert!(matches!(err, Error::StateDict(_)));
    let msg = err.to_string();
    for want in [
        "the checkpoint's shapes do not fit the model",
        "0.weight: model has shape [6, 4], file has [8, 4]",
        "0.bias: model has shape [6], file has [8]",
        "2.weight: model has shape [2, 6], file has [2, 8]",
        "build the model with the file's sizes",
    ] {
        assert!(msg.contains(want), "{want:?} not in {msg}");
    }
    for not_wanted in ["fix the names", "missing keys", "unexpected keys", "2.bias"] {
        assert!(!msg.contains(not_wanted), "{not_wanted:?} in {msg}");
    }
    assert_eq!(values(&wide), untouched);
}

#[test]
fn load_tensors_returns_names_sorted_as_named_tensors_documents() {
    manual_seed(6);
    // Registration order 0.weight, 0.bias, 2.weight, 2.bias, ..., 10.*: not sorted by name.
    let model = mlp(&[2, 3, 3, 3, 3, 3, 2], 0.0).unwrap();
    let own: Vec<String> = model.state_dict().into_iter().map(|(n, _)| n).collect();
    assert_eq!(own[..2], ["0.weight", "0.bias"]);
    let path = tmp("order.safetensors");
    save_safetensors(&model, &path).unwrap();
    let (tensors, _) = load_tensors(&path).unwrap();
    let names: Vec<&str> = tensors.iter().map(|(n, _)| n.as_str()).collect();
    let mut sorted = own.clone();
    sorted.sort();
    assert_ne!(own, sorted);
    assert_eq!(names, sorted);
    assert_eq!(names[..4], ["0.bias", "0.weight", "10.bias", "10.weight"]);
}

/// The layers of `small_convnet` in gen_fixtures.py, as an nn.Sequential.
fn small_convnet() -> Sequential {
    Sequential::new()
        .push(Conv2d::new(3, 4, 3, Conv2dConfig::default().padding(1)).unwrap())
        .push(BatchNorm2d::new(4).unwrap())
        .push(ReLU::new())
        .push(MaxPool2d::new(2, 2, 0).unwrap())
        .push(Flatten::new())
        .push(Linear::new(16 * 4, 3, true).unwrap())
}

#[test]
fn loads_a_file_written_by_pythons_safetensors() {
    let m = small_convnet();
    // Embedded, so the test binary runs without the source tree (the GPU machine).
    let path = tmp("small_convnet.safetensors");
    std::fs::write(&path, include_bytes!("fixtures/small_convnet.safetensors")).unwrap();
    let report = load_safetensors(&m, &path, true).unwrap();
    assert_eq!(report.loaded.len(), 9);
    let (file, _) = kiln_models::checkpoint::load_tensors(&path).unwrap();
    let get = |k: &str| file.iter().find(|(n, _)| n == k).unwrap().1.clone();
    let nbt: Tensor = get("1.num_batches_tracked");
    assert_eq!(nbt.dtype(), kiln_autograd::DType::I64);
    assert_eq!(nbt.to_vec::<i64>().unwrap(), vec![3]);
    for (name, t) in m.state_dict() {
        assert_eq!(
            t.to_vec_f64().unwrap(),
            get(&name).to_vec_f64().unwrap(),
            "{name}"
        );
    }
}

fn python_with_torchvision() -> Result<String, String> {
    let candidates = [
        std::env::var("KILN_TORCH_PYTHON").ok(),
        Some("/work/venv-torch/bin/python".into()),
        Some("python3".into()),
    ];
    for py in candidates.into_iter().flatten() {
        let ok = std::process::Command::new(&py)
            .args(["-c", "import torch, torchvision, safetensors"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if ok {
            return Ok(py);
        }
    }
    Err("no Python with torch, torchvision and safetensors (set KILN_TORCH_PYTHON)".into())
}

#[test]
fn torchvision_loads_kiln_checkpoints_with_strict_true_and_agrees_on_logits() {
    let py = match python_with_torchvision() {
        Ok(py) => py,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    manual_seed(5);
    let mut m = common::tiny_resnet(10, false);
    // Train-mode forwards move the BatchNorm statistics away from their initial values.
    for _ in 0..2 {
        m.forward(
            &Tensor::randn(
                &[4, 3, 32, 32],
                kiln_autograd::DType::F32,
                kiln_autograd::Device::Cpu,
            )
            .unwrap(),
        )
        .unwrap();
    }
    let path = tmp("for_torchvision.safetensors");
    save_safetensors(&m, &path).unwrap();
    let script = tmp("load_in_torchvision.py");
    std::fs::write(&script, include_str!("fixtures/load_in_torchvision.py")).unwrap();
    let out = std::process::Command::new(&py)
        .args([
            script.to_str().unwrap(),
            path.to_str().unwrap(),
            "1,1,1,1",
            "10",
            "2,3,32,32",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("strict=True"), "{stdout}");
    let torch_logits: Vec<f32> = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    m.eval();
    let n = 2 * 3 * 32 * 32;
    let x: Vec<f32> = (0..n).map(|i| (0.37 * i as f64).cos() as f32).collect();
    let x = Tensor::from_vec(x, &[2, 3, 32, 32], kiln_autograd::Device::Cpu).unwrap();
    let kiln_logits = m.forward(&x).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(kiln_logits.len(), torch_logits.len());
    for (k, t) in kiln_logits.iter().zip(&torch_logits) {
        assert!(
            (k - t).abs() <= 1e-4 * t.abs().max(1.0),
            "kiln {k} vs torchvision {t}"
        );
    }
}

#[test]
fn training_checkpoints_carry_optimizer_tensors_and_scheduler_state() {
    use kiln_models::checkpoint::{
        load_training_checkpoint, save_training_checkpoint, TrainingState,
    };
    manual_seed(6);
    let a = mlp(&[4, 8, 2], 0.0).unwrap();
    let exp_avg: Vec<(String, Tensor)> = a
        .named_parameters()
        .into_iter()
        .map(|(n, p)| {
            (
                format!("state.{n}.exp_avg"),
                p.mul_scalar(0.5).unwrap().detach(),
            )
        })
        .collect();
    let mut metadata = std::collections::HashMap::new();
    metadata.insert(
        "scheduler".to_string(),
        r#"{"last_epoch":3,"base_lrs":[0.1]}"#.to_string(),
    );
    metadata.insert("epoch".to_string(), "3".to_string());
    let state = TrainingState {
        optimizer_tensors: exp_avg.clone(),
        metadata: metadata.clone(),
    };
    let path = tmp("train.safetensors");
    save_training_checkpoint(&a, &state, &path).unwrap();
    manual_seed(7);
    let b = mlp(&[4, 8, 2], 0.0).unwrap();
    let (report, back) = load_training_checkpoint(&b, &path, true).unwrap();
    assert!(report.is_exact());
    assert_eq!(values(&a), values(&b));
    assert_eq!(back.metadata, metadata);
    let mut want: Vec<(String, Vec<f64>)> = exp_avg
        .iter()
        .map(|(n, t)| (n.clone(), t.to_vec_f64().unwrap()))
        .collect();
    want.sort_by(|x, y| x.0.cmp(&y.0));
    let got: Vec<(String, Vec<f64>)> = back
        .optimizer_tensors
        .iter()
        .map(|(n, t)| (n.clone(), t.to_vec_f64().unwrap()))
        .collect();
    assert_eq!(got, want);
    // A plain model file is not a training checkpoint.
    save_safetensors(&a, tmp("plain.safetensors")).unwrap();
    let err = load_training_checkpoint(&b, tmp("plain.safetensors"), true).unwrap_err();
    assert!(
        err.to_string().contains("not a kiln training checkpoint"),
        "{err}"
    );
}

#[test]
fn stale_temp_files_of_killed_writes_are_removed_and_live_ones_kept() {
    let path = tmp("stale.safetensors");
    let dir = path.parent().unwrap().to_path_buf();
    // A pid above Linux's largest (2^22) never runs; this process's own file is live.
    let dead = dir.join(".stale.safetensors.tmp-999999999");
    let live = dir.join(format!(".stale.safetensors.tmp-{}", std::process::id()));
    let other = dir.join(".other.safetensors.tmp-999999999");
    for f in [&dead, &live, &other] {
        std::fs::write(f, b"half a checkpoint").unwrap();
    }
    let removed = kiln_models::checkpoint::remove_stale_temp_files(&path).unwrap();
    assert_eq!(removed, vec![dead.clone()]);
    assert!(!dead.exists() && live.exists() && other.exists());
    let missing = dir.join("no-such-folder").join("x.safetensors");
    assert!(kiln_models::checkpoint::remove_stale_temp_files(missing)
        .unwrap()
        .is_empty());
    for f in [&live, &other] {
        std::fs::remove_file(f).unwrap();
    }
    // Another process's file is kept while that process runs, and is stale once it has exited.
    let mut child = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let writer = dir.join(format!(".stale.safetensors.tmp-{}", child.id()));
    std::fs::write(&writer, b"being written").unwrap();
    let kept = kiln_models::checkpoint::remove_stale_temp_files(&path);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(kept.unwrap().is_empty() && writer.exists());
    let removed = kiln_models::checkpoint::remove_stale_temp_files(&path).unwrap();
    assert_eq!(removed, vec![writer]);
}

/// Two tensors under one name would make the second silently win on load: refused on save,
/// and nothing is written.
#[test]
fn a_name_given_twice_is_refused_on_save() {
    let path = tmp("twice.safetensors");
    let t = Tensor::from_vec(vec![1.0f32, 2.0], &[2], kiln_autograd::Device::Cpu).unwrap();
    let tensors = [("w".to_string(), t.clone()), ("w".to_string(), t)];
    let err = kiln_models::checkpoint::save_tensors(&tensors, None, &path).unwrap_err();
    assert!(
        err.to_string().contains("the name \"w\" appears twice"),
        "{err}"
    );
    assert!(!path.exists());
}

#[test]
fn truncated_files_say_truncated_with_the_byte_counts() {
    let path = tmp("whole.safetensors");
    let t = Tensor::from_vec(vec![1.0f32; 64], &[64], kiln_autograd::Device::Cpu).unwrap();
    kiln_models::checkpoint::save_tensors(&[("t".into(), t)], None, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let cases = [
        (4, "4 bytes, fewer than the 8".to_string()),
        (
            20,
            format!("declares {header_len} bytes but only 12 follow"),
        ),
        (
            8 + header_len - 1,
            format!(
                "declares {header_len} bytes but only {} follow",
                header_len - 1
            ),
        ),
        (
            8 + header_len + 100,
            "declare 256 bytes of data but only 100".to_string(),
        ),
    ];
    for (cut, want) in cases {
        let cut_path = tmp(&format!("cut-{cut}.safetensors"));
        std::fs::write(&cut_path, &bytes[..cut]).unwrap();
        let msg = kiln_models::checkpoint::load_tensors(&cut_path)
            .unwrap_err()
            .to_string();
        assert!(msg.contains(&want) && msg.contains("truncated"), "{msg}");
    }
}
