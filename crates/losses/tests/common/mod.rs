//! Shared test helpers: fixture tensors and the finite-difference gradient checker.
#![allow(dead_code)]

use kiln_autograd::testing::grad_probe;
use kiln_autograd::{Device, Tensor};
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
    kiln_testkit::assert_close(what, &g, &w, (atol, rtol));
}

/// Checks the analytic gradients of `f` with respect to `inputs` (f64) against central finite
/// differences (step 1e-6) of `sum(f(inputs) * w)` for a fixed random `w`: an element passes
/// when `|analytic - numeric| <= 1e-6 + 1e-5 * |numeric|`.
pub fn gradcheck(
    name: &str,
    inputs: &[Tensor],
    f: impl Fn(&[Tensor]) -> kiln_losses::Result<Tensor>,
) {
    let probe = grad_probe(inputs, f).unwrap_or_else(|e| panic!("{name}: {e}"));
    kiln_testkit::gradcheck(
        name,
        &probe.values,
        &probe.analytic,
        1e-6,
        (1e-6, 1e-5),
        |i, v| probe.loss(i, v).unwrap(),
    );
}
