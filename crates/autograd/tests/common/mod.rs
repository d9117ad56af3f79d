//! Shared test helpers: the device list every op test runs over, and the finite-difference
//! gradient checker.
#![allow(dead_code)]

use kiln_autograd::{no_grad, DType, Device, Generator, Result, Tensor};

/// Devices op tests run on: the CPU always, and `cuda:0` when a GPU is usable
/// (`cuda_device_or_skip` prints why not; with `KILN_REQUIRE_CUDA=1` it fails instead). Every
/// test loops over this list and checks each device against the same reference values, so a
/// GPU run compares CUDA results with what the CPU must produce.
pub fn devices() -> Vec<Device> {
    let mut v = vec![Device::Cpu];
    if let Some(d) = kiln_device::testing::cuda_device_or_skip() {
        v.push(d);
    }
    v
}

/// Deterministic f64 test data of `shape` (normal, seeded).
pub fn data(seed: u64, shape: &[usize]) -> Tensor {
    Generator::new(seed)
        .normal(shape, 0.0, 1.0, DType::F64, Device::Cpu)
        .unwrap()
}

/// Checks `f`'s analytic gradients against central finite differences in f64.
///
/// The scalar checked is `sum(f(inputs) * w)` with a fixed random `w`, so every output element
/// carries a different weight and a gradient that mixes elements up is caught.
pub fn gradcheck(name: &str, inputs: &[Tensor], f: impl Fn(&[Tensor]) -> Result<Tensor>) {
    let leaves: Vec<Tensor> = inputs
        .iter()
        .map(|t| {
            let l = t.detach();
            l.set_requires_grad(true).unwrap();
            l
        })
        .collect();
    let out = f(&leaves).unwrap_or_else(|e| panic!("{name}: forward failed: {e}"));
    let w = Generator::new(99)
        .uniform(out.shape(), 0.5, 1.5, DType::F64, Device::Cpu)
        .unwrap();
    let loss = out.mul(&w).unwrap().sum_all().unwrap();
    loss.backward()
        .unwrap_or_else(|e| panic!("{name}: backward failed: {e}"));
    let eps = 1e-6;
    for (i, leaf) in leaves.iter().enumerate() {
        let analytic = leaf
            .grad()
            .unwrap_or_else(|| panic!("{name}: input {i} got no gradient"))
            .to_vec::<f64>()
            .unwrap();
        let base = leaf.to_vec::<f64>().unwrap();
        for j in 0..base.len() {
            let eval = |delta: f64| -> f64 {
                let mut v = base.clone();
                v[j] += delta;
                let mut args: Vec<Tensor> = leaves.iter().map(|t| t.detach()).collect();
                args[i] = Tensor::from_vec(v, leaf.shape(), Device::Cpu).unwrap();
                no_grad(|| {
                    f(&args)
                        .unwrap()
                        .mul(&w)
                        .unwrap()
                        .sum_all()
                        .unwrap()
                        .item()
                        .unwrap()
                })
            };
            let numeric = (eval(eps) - eval(-eps)) / (2.0 * eps);
            let a = analytic[j];
            assert!(
                (a - numeric).abs() <= 1e-6 + 1e-4 * numeric.abs(),
                "{name}: d/d input{i}[{j}]: analytic {a} vs numeric {numeric}"
            );
        }
    }
}

/// Asserts two f64 slices agree to `tol` (absolute + relative).
pub fn assert_close(name: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(
        got.len(),
        want.len(),
        "{name}: length {} vs {}",
        got.len(),
        want.len()
    );
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{name}[{i}]: got {g}, want {w}"
        );
    }
}
