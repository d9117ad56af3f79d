//! Shared test helpers: fixture tensors and the finite-difference gradient checker.
#![allow(dead_code)]

use kiln_autograd::{no_grad, DType, Device, Generator, Tensor};
use serde_json::Value;

/// The tensor a fixture entry describes (`{shape, dtype, data}`), or `None` for `null`.
pub fn tensor(v: &Value) -> Option<Tensor> {
    if v.is_null() {
        return None;
    }
    let shape: Vec<usize> = v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap() as usize)
        .collect();
    let data = v["data"].as_array().unwrap();
    let floats = || -> Vec<f64> {
        data.iter()
            .map(|x| match x.as_str() {
                Some(s) => s.parse::<f64>().unwrap(),
                None => x.as_f64().unwrap(),
            })
            .collect()
    };
    let dev = Device::Cpu;
    Some(match v["dtype"].as_str().unwrap() {
        "float64" => Tensor::from_vec(floats(), &shape, dev).unwrap(),
        "float32" => Tensor::from_vec(
            floats().into_iter().map(|x| x as f32).collect(),
            &shape,
            dev,
        )
        .unwrap(),
        "int64" => Tensor::from_vec(
            data.iter().map(|x| x.as_i64().unwrap()).collect(),
            &shape,
            dev,
        )
        .unwrap(),
        "uint8" => Tensor::from_vec(
            data.iter().map(|x| x.as_u64().unwrap() as u8).collect(),
            &shape,
            dev,
        )
        .unwrap(),
        other => panic!("fixture dtype {other}"),
    })
}

/// Asserts `got` matches `want` elementwise within `atol + rtol * |want|` (NaN matches NaN).
pub fn assert_close(what: &str, got: &Tensor, want: &Tensor, atol: f64, rtol: f64) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let (g, w) = (got.to_vec_f64().unwrap(), want.to_vec_f64().unwrap());
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let ok = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= atol + rtol * b.abs();
        assert!(
            ok,
            "{what}[{i}]: got {a}, want {b}\n got  {g:?}\n want {w:?}"
        );
    }
}

/// Checks the analytic gradients of `f` with respect to `inputs` (f64) against central finite
/// differences of `sum(f(inputs) * w)` for a fixed random `w`.
pub fn gradcheck(
    name: &str,
    inputs: &[Tensor],
    f: impl Fn(&[Tensor]) -> kiln_losses::Result<Tensor>,
) {
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
    out.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
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
                (a - numeric).abs() <= 1e-6 + 1e-5 * numeric.abs(),
                "{name}: d/d input {i}[{j}]: analytic {a}, numeric {numeric}"
            );
        }
    }
}
