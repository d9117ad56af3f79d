//! Freezing a backbone end to end, with a real optimizer: the frozen parameters get no gradient,
//! no optimizer state and keep their values bit for bit; the head trains.

use kiln::autograd::{manual_seed, DType, Device, Module, Tensor};
use kiln::losses::{cross_entropy, CrossEntropyOptions};
use kiln::models::models::mlp;
use kiln::models::{Freeze, Layer};
use kiln::optim::{AdamOptions, AdamW, Optimizer, ParamGroup};

#[test]
fn frozen_backbone_gets_no_gradient_no_state_and_no_update() {
    manual_seed(11);
    let model = mlp(&[6, 16, 16, 3], 0.0).unwrap();
    // Layers 0 and 2 are the backbone's Linear layers; 4 is the head.
    assert_eq!(model.freeze(|n| !n.starts_with("4.")).unwrap(), 4);
    let before: Vec<(String, Vec<f32>)> = model
        .named_parameters()
        .into_iter()
        .map(|(n, p)| (n, p.tensor().to_vec::<f32>().unwrap()))
        .collect();

    // The optimizer is given every parameter, as a careless user would: frozen ones must be
    // skipped by the optimizer itself.
    let mut opt = AdamW::new(
        vec![ParamGroup::from_module(&model)],
        AdamOptions::adamw().lr(1e-2).weight_decay(1e-2),
    )
    .unwrap();
    let x = Tensor::randn(&[8, 6], DType::F32, Device::Cpu).unwrap();
    let y = Tensor::from_vec(vec![0i64, 1, 2, 0, 1, 2, 0, 1], &[8], Device::Cpu).unwrap();
    for _ in 0..3 {
        opt.zero_grad(true).unwrap();
        let loss = cross_entropy(
            &model.forward(&x).unwrap(),
            &y,
            &CrossEntropyOptions::default(),
        )
        .unwrap();
        loss.backward().unwrap();
        opt.step().unwrap();
    }

    for ((name, p), (_, old)) in model.named_parameters().into_iter().zip(&before) {
        let head = name.starts_with("4.");
        assert_eq!(p.grad().is_some(), head, "{name}: gradient");
        assert_eq!(opt.has_state(&p), head, "{name}: optimizer state");
        let now = p.tensor().to_vec::<f32>().unwrap();
        if head {
            assert_ne!(&now, old, "{name}: the head must train");
        } else {
            // Weight decay must not touch frozen parameters either.
            assert_eq!(&now, old, "{name}: a frozen parameter changed");
        }
    }
}
