//! Engine semantics: accumulation, retain_graph, freeing saved tensors, grad mode, detach,
//! freezing, and the Module/Parameter contract.

use kiln_autograd::{
    enable_grad, is_grad_enabled, no_grad, DType, Device, EnableGradGuard, Module, NoGradGuard,
    Parameter, Tensor,
};

fn leaf(v: &[f64]) -> Tensor {
    let t = Tensor::from_slice(v, &[v.len()], Device::Cpu).unwrap();
    t.set_requires_grad(true).unwrap();
    t
}

fn grad(t: &Tensor) -> Vec<f64> {
    t.grad().expect("a gradient").to_vec::<f64>().unwrap()
}

#[test]
fn gradients_accumulate_across_backward_calls() {
    let x = leaf(&[1.0, 2.0]);
    x.mul(&x).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(grad(&x), vec![2.0, 4.0]);
    x.mul_scalar(3.0)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(grad(&x), vec![5.0, 7.0]);
    assert!(x.is_leaf() && x.grad().unwrap().is_contiguous());
}

#[test]
fn retain_graph_allows_a_second_backward() {
    let x = leaf(&[3.0]);
    let y = x.exp().unwrap().sum_all().unwrap();
    y.backward_with(None, true).unwrap();
    y.backward_with(None, false).unwrap();
    assert!((grad(&x)[0] - 2.0 * 3f64.exp()).abs() < 1e-12);
    assert!(
        y.backward().is_err(),
        "the graph was freed by the second call"
    );
}

#[test]
fn saved_tensors_are_freed_when_their_node_runs() {
    let x = leaf(&[0.5, 1.5]);
    let y = x.exp().unwrap(); // ExpBackward saves its output
    assert_eq!(
        y.storage_use_count(),
        2,
        "y plus the copy saved for backward"
    );
    let z = x.mul(&x).unwrap(); // MulBackward saves both inputs (x twice)
                                // Leaf edges hold the leaf's handle, not a new storage handle.
    assert_eq!(x.storage_use_count(), 3, "x and its two saved copies");
    assert_eq!(z.storage_use_count(), 1, "mul does not save its output");
    let loss = y.sum_all().unwrap().add(&z.sum_all().unwrap()).unwrap();
    loss.backward().unwrap();
    assert_eq!(y.storage_use_count(), 1);
    assert_eq!(x.storage_use_count(), 1, "saved copies dropped");
}

#[test]
fn no_grad_records_nothing_and_guards_nest() {
    let x = leaf(&[1.0, 2.0]);
    assert!(is_grad_enabled());
    let y = no_grad(|| x.exp().unwrap());
    assert!(!y.requires_grad() && y.grad_fn_name().is_none());
    assert_eq!(x.storage_use_count(), 1, "nothing saved under no_grad");
    {
        let _outer = NoGradGuard::new();
        assert!(!is_grad_enabled());
        {
            let _inner = EnableGradGuard::new();
            assert_eq!(x.exp().unwrap().grad_fn_name(), Some("ExpBackward"));
        }
        assert!(!is_grad_enabled());
        assert!(enable_grad(|| x.sigmoid().unwrap()).requires_grad());
        // grad mode is per thread: a new thread starts enabled
        assert!(std::thread::spawn(is_grad_enabled).join().unwrap());
    }
    assert!(is_grad_enabled());
}

#[test]
fn detach_and_freezing_stop_gradients() {
    let x = leaf(&[2.0]);
    let d = x.detach();
    assert!(d.shares_storage_with(&x) && !d.requires_grad());
    let w = leaf(&[5.0]);
    w.set_requires_grad(false).unwrap();
    let y = x.mul(&w).unwrap().add(&d.mul(&x).unwrap()).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(grad(&x), vec![5.0 + 2.0]);
    assert!(w.grad().is_none());
}

/// A leaf frozen after the forward (PyTorch's `w.requires_grad_(False)` between forward and
/// backward) gets no gradient, as PyTorch's `AccumulateGrad` skips a leaf that no longer
/// requires grad; the other leaves of the same graph still get theirs.
#[test]
fn a_leaf_frozen_after_the_forward_gets_no_gradient() {
    let x = leaf(&[2.0, 3.0]);
    let w = leaf(&[5.0, 7.0]);
    let y = x.mul(&w).unwrap().mul(&w).unwrap().sum_all().unwrap();
    w.set_requires_grad(false).unwrap();
    y.backward().unwrap();
    assert!(w.grad().is_none(), "frozen before backward: no gradient");
    assert_eq!(grad(&x), vec![25.0, 49.0]);
}

#[test]
fn backward_with_an_explicit_gradient() {
    let x = leaf(&[1.0, 2.0, 3.0]);
    let y = x.mul_scalar(2.0).unwrap();
    let g = Tensor::from_slice(&[1.0, 10.0, 100.0], &[3], Device::Cpu).unwrap();
    y.backward_with(Some(&g), false).unwrap();
    assert_eq!(grad(&x), vec![2.0, 20.0, 200.0]);
}

#[test]
fn backward_on_a_leaf_and_through_views() {
    let x = leaf(&[4.0]);
    x.sum_all().unwrap().backward().unwrap();
    assert_eq!(grad(&x), vec![1.0]);
    let m = Tensor::from_slice(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], Device::Cpu).unwrap();
    m.set_requires_grad(true).unwrap();
    let s = m
        .t()
        .unwrap()
        .narrow(0, 1, 2)
        .unwrap()
        .select(1, 0)
        .unwrap();
    assert_eq!(s.to_vec::<f64>().unwrap(), vec![2.0, 3.0]);
    s.sum_all().unwrap().backward().unwrap();
    assert_eq!(grad(&m), vec![0.0, 1.0, 1.0, 0.0, 0.0, 0.0]);
}

#[test]
fn max_ties_split_like_pytorch() {
    let a = leaf(&[1.0, 2.0, 3.0]);
    let b = leaf(&[1.0, 5.0, 0.0]);
    a.maximum(&b)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(grad(&a), vec![0.5, 0.0, 1.0]);
    assert_eq!(grad(&b), vec![0.5, 1.0, 0.0]);
    let x = leaf(&[3.0, 1.0, 3.0]);
    x.amax(&[], false).unwrap().backward().unwrap();
    assert_eq!(grad(&x), vec![0.5, 0.0, 0.5]);
    let y = leaf(&[3.0, 1.0, 3.0]);
    let (v, i) = y.max_dim(0, false).unwrap();
    assert_eq!(
        (v.item().unwrap(), i.to_vec::<i64>().unwrap()),
        (3.0, vec![0])
    );
    v.backward().unwrap();
    assert_eq!(grad(&y), vec![1.0, 0.0, 0.0]);
}

#[test]
fn norm_gradient_at_zero_is_zero() {
    let x = leaf(&[0.0, 0.0]);
    x.norm(2.0, &[], false).unwrap().backward().unwrap();
    assert_eq!(grad(&x), vec![0.0, 0.0]);
}

struct Linear {
    weight: Parameter,
    bias: Parameter,
    training: bool,
}

struct Mlp {
    layers: Vec<Linear>,
    scale: Parameter,
    training: bool,
}

fn param(shape: &[usize], v: f64) -> Parameter {
    Parameter::new(Tensor::full(shape, v, DType::F64, Device::Cpu).unwrap()).unwrap()
}

impl Module for Linear {
    fn own_parameters(&self) -> Vec<(String, Parameter)> {
        vec![
            ("weight".into(), self.weight.clone()),
            ("bias".into(), self.bias.clone()),
        ]
    }
    fn is_training(&self) -> bool {
        self.training
    }
    fn set_training_flag(&mut self, training: bool) {
        self.training = training;
    }
}

impl Module for Mlp {
    fn own_parameters(&self) -> Vec<(String, Parameter)> {
        vec![("scale".into(), self.scale.clone())]
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        self.layers
            .iter()
            .enumerate()
            .map(|(i, l)| (format!("layers.{i}"), l as &dyn Module))
            .collect()
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        self.layers
            .iter_mut()
            .enumerate()
            .map(|(i, l)| (format!("layers.{i}"), l as &mut dyn Module))
            .collect()
    }
    fn is_training(&self) -> bool {
        self.training
    }
    fn set_training_flag(&mut self, training: bool) {
        self.training = training;
    }
}

#[test]
fn module_names_modes_and_zero_grad() {
    let lin = || Linear {
        weight: param(&[2, 2], 0.5),
        bias: param(&[2], 0.1),
        training: true,
    };
    let mut m = Mlp {
        layers: vec![lin(), lin()],
        scale: param(&[], 2.0),
        training: true,
    };
    let names: Vec<String> = m.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "scale",
            "layers.0.weight",
            "layers.0.bias",
            "layers.1.weight",
            "layers.1.bias"
        ]
    );
    m.eval();
    assert!(!m.is_training() && m.layers.iter().all(|l| !l.is_training()));
    m.train(true);
    assert!(m.layers[1].is_training());

    let x = Tensor::ones(&[3, 2], DType::F64, Device::Cpu).unwrap();
    let mut h = x;
    for l in &m.layers {
        h = h.matmul(&l.weight).unwrap().add(&l.bias).unwrap();
    }
    h.mul(&m.scale)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert!(m.parameters().iter().all(|p| p.grad().is_some()));
    m.zero_grad(false).unwrap();
    assert!(m.parameters().iter().all(|p| p
        .grad()
        .unwrap()
        .to_vec_f64()
        .unwrap()
        .iter()
        .all(|&v| v == 0.0)));
    m.zero_grad(true).unwrap();
    assert!(m.parameters().iter().all(|p| p.grad().is_none()));
    m.set_requires_grad(false).unwrap();
    assert!(m.parameters().iter().all(|p| !p.requires_grad()));
}

#[test]
fn a_very_long_graph_backprops_and_drops_without_overflowing_the_stack() {
    let x = leaf(&[1.0]);
    let mut y = x.clone();
    for _ in 0..30_000 {
        y = y.mul_scalar(1.0).unwrap();
    }
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(grad(&x), vec![1.0]);
    drop(y);
}

/// PyTorch 2.15's subgradients where the functions have none: `clamp` passes the gradient only
/// strictly inside `(min, max)` (0 at either bound; kiln's composition from `maximum` /
/// `minimum` gave 1/2 there), and `std` of a constant slice has gradient 0 (its `std_backward`
/// masks `g / (2 std)`; `sqrt`'s chain rule gave NaN). Values from PyTorch 2.15, f64.
#[test]
fn clamp_bounds_and_constant_std_take_pytorchs_subgradients() {
    let x = Tensor::from_vec(vec![0.0f64, 0.5, 1.0, -1.0, 2.0], &[5], Device::Cpu).unwrap();
    let x = x.set_requires_grad(true).unwrap();
    x.clamp(0.0, 1.0)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(
        x.grad().unwrap().to_vec::<f64>().unwrap(),
        [0.0, 1.0, 0.0, 0.0, 0.0]
    );

    let v = vec![2.0f64, 2.0, 2.0, 1.0, 3.0, 2.0];
    let d = Tensor::from_vec(v, &[2, 3], Device::Cpu).unwrap();
    let d = d.set_requires_grad(true).unwrap();
    let std = d.std(&[1], 1, false).unwrap();
    assert_eq!(std.to_vec::<f64>().unwrap(), [0.0, 1.0]);
    std.sum_all().unwrap().backward().unwrap();
    let g = d.grad().unwrap().to_vec::<f64>().unwrap();
    assert_eq!(g, [0.0, 0.0, 0.0, -0.5, 0.5, 0.0]);
}

/// `logsumexp` over an empty dim is -inf (the log of an empty sum), as PyTorch's; it was
/// refused, since its shift by the maximum has no maximum there.
#[test]
fn logsumexp_over_an_empty_dim_is_minus_infinity() {
    let x = Tensor::zeros(&[0, 3], DType::F64, Device::Cpu).unwrap();
    let x = x.set_requires_grad(true).unwrap();
    let y = x.logsumexp(&[0], true).unwrap();
    assert_eq!(y.shape(), &[1, 3]);
    assert_eq!(y.to_vec::<f64>().unwrap(), [f64::NEG_INFINITY; 3]);
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(x.grad().unwrap().shape(), &[0, 3]);
    let z = Tensor::zeros(&[2, 0], DType::F64, Device::Cpu).unwrap();
    let z = z.logsumexp(&[-1], false).unwrap();
    assert_eq!(z.to_vec::<f64>().unwrap(), [f64::NEG_INFINITY; 2]);
}
