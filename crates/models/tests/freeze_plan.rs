//! Freezing by name, and the training memory plan.

mod common;

use kiln_autograd::{manual_seed, DType, Device, Module, Tensor};
use kiln_models::layers::{LayerNorm, Linear, Sequential};
use kiln_models::models::{mlp, resnet18};
use kiln_models::{max_batch_size, plan, summary, Error, Freeze, Layer, OptimizerKind};

#[test]
fn a_frozen_backbone_gets_no_gradient() {
    manual_seed(2);
    let m = mlp(&[4, 8, 8, 2], 0.0).unwrap();
    assert_eq!(m.freeze(|n| !n.starts_with("4.")).unwrap(), 4);
    let trainable: Vec<String> = m
        .trainable_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(trainable, ["4.weight", "4.bias"]);
    let x = Tensor::randn(&[5, 4], DType::F32, Device::Cpu).unwrap();
    common::assert_only_head_gets_gradients(&m, &x, "4.");
    // Summary shows the frozen part as non-trainable.
    let s = summary(&m, &[5, 4]).unwrap();
    assert_eq!(s.total_params, 4 * 8 + 8 + 8 * 8 + 8 + 8 * 2 + 2);
    assert_eq!(s.trainable_params, 8 * 2 + 2);
    assert_eq!(s.non_trainable_params, s.total_params - 18);
    assert!(s.to_string().contains("(40)"), "{s}");
    assert_eq!(m.unfreeze(|n| n.starts_with("0.")).unwrap(), 2);
    assert_eq!(m.trainable_parameters().len(), 4);
}

/// Freezing after a backward drops the gradients the frozen parameters hold (as
/// `requires_grad_(False)` plus `zero_grad(set_to_none=True)` on them would): an optimizer
/// given every parameter would otherwise keep stepping the frozen ones with a stale gradient.
#[test]
fn freezing_clears_the_gradients_already_held() {
    manual_seed(3);
    let m = mlp(&[4, 8, 2], 0.0).unwrap();
    let x = Tensor::randn(&[5, 4], DType::F32, Device::Cpu).unwrap();
    m.forward(&x)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let named = m.named_parameters();
    assert!(named.iter().all(|(_, p)| p.grad().is_some()));
    assert_eq!(m.freeze(|n| n.starts_with("0.")).unwrap(), 2);
    for (name, p) in &named {
        let frozen = name.starts_with("0.");
        assert_eq!(p.grad().is_none(), frozen, "{name}");
        assert_eq!(p.requires_grad(), !frozen, "{name}");
    }
}

#[test]
fn saved_activations_are_counted_once_and_shrink_when_frozen() {
    manual_seed(2);
    // Linear(4, 8) keeps its input (16 B/sample) for the weight gradient; ReLU keeps its output
    // (32 B), which the second Linear keeps too: counted once. 48 B per sample.
    let m = mlp(&[4, 8, 2], 0.0).unwrap();
    let p = plan(&m, &[4], DType::F32, OptimizerKind::Adam).unwrap();
    assert_eq!(p.saved_activation_bytes_per_sample, 48);
    assert_eq!(p.saved_activation_bytes_fixed, 0);
    assert_eq!(p.param_bytes, (4 * 8 + 8 + 8 * 2 + 2) * 4);
    assert_eq!(p.grad_bytes, p.param_bytes);
    assert_eq!(p.optimizer_state_bytes, 2 * p.param_bytes);
    // Frozen first layer: nothing upstream needs a gradient, so only the second Linear's input.
    m.freeze(|n| n.starts_with("0.")).unwrap();
    let f = plan(&m, &[4], DType::F32, OptimizerKind::Adam).unwrap();
    assert_eq!(f.saved_activation_bytes_per_sample, 32);
    assert_eq!(f.grad_bytes, (8 * 2 + 2) * 4);
    assert_eq!(f.optimizer_state_bytes, 2 * f.grad_bytes);
}

#[test]
fn resnet18_plan_and_max_batch_size() {
    manual_seed(0);
    let m = resnet18(1000).unwrap();
    let sgd = plan(&m, &[3, 224, 224], DType::F32, OptimizerKind::Sgd).unwrap();
    let adamw = plan(&m, &[3, 224, 224], DType::F32, OptimizerKind::AdamW).unwrap();
    println!("{sgd}\n{adamw}");
    assert_eq!(sgd.param_bytes, 11_689_512 * 4);
    assert_eq!(adamw.optimizer_state_bytes, 2 * 11_689_512 * 4);
    // Per sample: the input (0.60 MB), the stem's conv output and ReLU output (3.21 MB each),
    // the max-pool indices (1.61 MB), then per stage the conv inputs, BN inputs and ReLU outputs
    // (each counted once): 22.18 MB.
    let per = adamw.saved_activation_bytes_per_sample as f64 / 1e6;
    assert!((22.1..22.3).contains(&per), "{per} MB");
    // BatchNorm keeps a mean and inverse std per channel whatever the batch.
    let bn_channels = 64 + 4 * (64 + 128 + 256 + 512) + 128 + 256 + 512;
    assert_eq!(adamw.saved_activation_bytes_fixed, bn_channels * 2 * 4);
    let gib = 1usize << 30;
    let b = max_batch_size(&m, &[3, 224, 224], OptimizerKind::AdamW, 8 * gib).unwrap();
    assert!(adamw.peak_bytes(b) <= 8 * gib && adamw.peak_bytes(b + 1) > 8 * gib);
    let b_sgd = max_batch_size(&m, &[3, 224, 224], OptimizerKind::Sgd, 8 * gib).unwrap();
    assert!(b_sgd >= b);
    let err = max_batch_size(&m, &[3, 224, 224], OptimizerKind::AdamW, 100_000_000).unwrap_err();
    assert!(matches!(err, Error::Memory(_)));
    assert!(
        err.to_string().contains("cannot hold even one sample"),
        "{err}"
    );
    assert_eq!(m.type_name(), "ResNet");
}

#[test]
fn attention_plans_what_its_backward_keeps() {
    use kiln_models::layers::MultiheadAttention;
    use kiln_models::Tracer;
    manual_seed(3);
    // MultiheadAttention(E = 8, 2 heads, dropout 0.1), one sample: a query of T = 3 positions
    // over keys and values of S = 5, all f32 (4 B). Its backward keeps the three inputs (for
    // the packed projection's weight gradient: 24 + 40 + 40 values), the projected q, k, v per
    // head (2 x 3 x 4, 2 x 5 x 4 twice: 104), the attention probabilities (2 x 3 x 5 = 30),
    // in training the dropout mask and the dropped probabilities (30 each), and the context
    // that out_proj multiplies (3 x 8 = 24).
    let (t, s) = (3, 5);
    let saved = |mha: &MultiheadAttention| {
        let mut tracer = Tracer::new();
        let q = tracer.input(&[1, t, 8], DType::F32);
        let k = tracer.input(&[1, s, 8], DType::F32);
        let v = tracer.input(&[1, s, 8], DType::F32);
        mha.trace_attend(&mut tracer, &q, &k, &v).unwrap();
        tracer.saved_bytes()
    };
    let mut mha = MultiheadAttention::new(8, 2, 0.1).unwrap();
    assert_eq!(saved(&mha), (104 + 104 + 30 + 60 + 24) * 4);
    // Evaluation mode drops no probabilities: nothing for dropout.
    mha.eval();
    assert_eq!(saved(&mha), (104 + 104 + 30 + 24) * 4);
    mha.train(true);
    // A frozen out_proj needs no weight gradient, so the context is not kept for it.
    assert_eq!(mha.freeze(|n| n.starts_with("out_proj")).unwrap(), 2);
    assert_eq!(saved(&mha), (104 + 104 + 30 + 60) * 4);
    // Nothing trainable and inputs without gradients: no backward, nothing kept.
    mha.freeze(|_| true).unwrap();
    assert_eq!(saved(&mha), 0);
}

#[test]
fn optimizer_names_parse_as_the_cli_takes_them() {
    for (name, kind, buffers) in [
        ("sgd", OptimizerKind::Sgd, 0),
        ("SGD-Momentum", OptimizerKind::SgdMomentum, 1),
        ("momentum", OptimizerKind::SgdMomentum, 1),
        ("adam", OptimizerKind::Adam, 2),
        ("AdamW", OptimizerKind::AdamW, 2),
    ] {
        let parsed: OptimizerKind = name.parse().unwrap();
        assert_eq!(parsed, kind, "{name}");
        assert_eq!(parsed.state_buffers(), buffers, "{name}");
    }
    let e = "lamb".parse::<OptimizerKind>().unwrap_err().to_string();
    assert!(
        e.contains("unknown optimizer \"lamb\"; use sgd, sgd-momentum, adam or adamw"),
        "{e}"
    );
}

#[test]
fn a_frozen_linear_after_trainable_layers_keeps_no_input() {
    manual_seed(3);
    // LayerNorm keeps its input, not its output; the middle Linear's input (the LayerNorm's
    // output, 8 floats per sample) is kept only for that Linear's weight gradient, so freezing
    // the weight drops it from the plan (as autograd drops it: x @ frozen_w keeps no x).
    let m = Sequential::new()
        .push(Linear::new(4, 8, true).unwrap())
        .push(LayerNorm::new(&[8], 1e-5).unwrap())
        .push(Linear::new(8, 8, true).unwrap())
        .push(Linear::new(8, 2, true).unwrap());
    let full = plan(&m, &[4], DType::F32, OptimizerKind::Sgd).unwrap();
    assert_eq!(m.freeze(|n| n.starts_with("2.")).unwrap(), 2);
    let frozen = plan(&m, &[4], DType::F32, OptimizerKind::Sgd).unwrap();
    assert_eq!(
        full.saved_activation_bytes_per_sample - frozen.saved_activation_bytes_per_sample,
        8 * 4
    );
}
