//! `LayerExt::to_device`: moving a model in place keeps names, handles and values; a moved model
//! trains; on CUDA a moved model computes the CPU's logits.

mod common;

use kiln_autograd::{manual_seed, Module, NoGradGuard, Tensor};
use kiln_device::{DType, Device};
use kiln_models::models::mlp;
use kiln_models::{Layer, LayerExt};

fn snapshot(m: &dyn Layer) -> Vec<(String, u64, Vec<f32>)> {
    m.state_dict()
        .into_iter()
        .map(|(n, t)| {
            let v = t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
            (n, t.id(), v)
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn to_cpu_keeps_names_handles_and_bits() {
    manual_seed(3);
    let m = common::tiny_resnet(10, true);
    let before = snapshot(&m);
    let trainable_before: Vec<bool> = m.parameters().iter().map(|p| p.requires_grad()).collect();
    m.to_device(Device::Cpu).unwrap();
    let after = snapshot(&m);
    assert_eq!(before.len(), after.len());
    assert_eq!(before.len(), 38 + 36);
    for ((n0, id0, v0), (n1, id1, v1)) in before.iter().zip(&after) {
        assert_eq!(n0, n1);
        assert_eq!(id0, id1, "{n0} is no longer the same handle");
        assert_eq!(bits(v0), bits(v1), "{n0} changed");
    }
    let trainable_after: Vec<bool> = m.parameters().iter().map(|p| p.requires_grad()).collect();
    assert_eq!(trainable_before, trainable_after);
    assert!(m
        .state_dict()
        .iter()
        .all(|(_, t)| t.device() == Device::Cpu));
}

/// Three plain SGD steps on a fixed regression batch; returns the losses.
fn train_steps(model: &dyn Layer, device: Device, steps: usize) -> Vec<f64> {
    manual_seed(11);
    let x = Tensor::randn(&[8, 4], DType::F32, Device::Cpu)
        .unwrap()
        .to_device(device)
        .unwrap();
    let y = Tensor::randn(&[8, 2], DType::F32, Device::Cpu)
        .unwrap()
        .to_device(device)
        .unwrap();
    let mut losses = Vec::new();
    for _ in 0..steps {
        model.zero_grad(true).unwrap();
        let loss = model
            .forward(&x)
            .unwrap()
            .sub(&y)
            .unwrap()
            .square()
            .unwrap();
        let loss = loss.mean_all().unwrap();
        losses.push(loss.item().unwrap());
        loss.backward().unwrap();
        let _g = NoGradGuard::new();
        for p in model.parameters() {
            let g = p.grad().expect("every parameter gets a gradient");
            assert_eq!(g.device(), device);
            let next = p.sub(&g.mul_scalar(0.1).unwrap()).unwrap();
            p.copy_(&next).unwrap();
        }
    }
    losses
}

#[test]
fn moved_model_trains_and_keeps_gradients_on_its_device() {
    manual_seed(5);
    let m = mlp(&[4, 16, 2], 0.0).unwrap();
    m.to_device(Device::Cpu).unwrap();
    let losses = train_steps(&m, Device::Cpu, 4);
    assert!(losses.iter().all(|l| l.is_finite()));
    assert!(losses[3] < losses[0], "loss did not decrease: {losses:?}");
}

#[test]
fn moving_a_graph_output_is_refused_with_the_fix() {
    let p = kiln_autograd::Parameter::new(Tensor::ones(&[2], DType::F32, Device::Cpu).unwrap())
        .unwrap();
    let y = p.mul_scalar(2.0).unwrap();
    let err = y.to_device_(Device::Cpu).unwrap_err().to_string();
    assert!(err.contains("to_device"), "{err}");
    assert!(err.contains("leaf"), "{err}");
}

#[test]
fn cuda_moved_model_matches_cpu_logits() {
    let Some(dev) = kiln_device::testing::cuda_device_or_skip() else {
        return;
    };
    manual_seed(7);
    let mut m = common::tiny_resnet(10, true);
    m.eval();
    let x = Tensor::randn(&[2, 3, 16, 16], DType::F32, Device::Cpu).unwrap();
    let cpu = m.forward(&x).unwrap().to_vec::<f32>().unwrap();
    let names: Vec<String> = m.state_dict().into_iter().map(|(n, _)| n).collect();
    m.to_device(dev).unwrap();
    assert!(m.state_dict().iter().all(|(_, t)| t.device() == dev));
    let moved: Vec<String> = m.state_dict().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, moved);
    let gpu = m
        .forward(&x.to_device(dev).unwrap())
        .unwrap()
        .to_device(Device::Cpu)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    for (a, b) in cpu.iter().zip(&gpu) {
        assert!(
            (a - b).abs() <= 1e-3 + 1e-3 * a.abs(),
            "cpu {a} vs cuda {b}"
        );
    }
    // A moved model trains on the device, gradients included; and comes back bit for bit.
    let small = mlp(&[4, 16, 2], 0.0).unwrap();
    small.to_device(dev).unwrap();
    let losses = train_steps(&small, dev, 4);
    assert!(
        losses[3] < losses[0],
        "loss did not decrease on CUDA: {losses:?}"
    );
    let on_gpu = snapshot(&small);
    small.to_device(Device::Cpu).unwrap();
    for ((n, _, a), (_, _, b)) in on_gpu.iter().zip(&snapshot(&small)) {
        assert_eq!(bits(a), bits(b), "{n} changed on the way back");
    }
}
