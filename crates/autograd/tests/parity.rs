//! PyTorch parity: forward values and gradients of matmul (with batch broadcasting and 1-D
//! operands), softmax, log_softmax, and a few unary ops and reductions, in f32, against fixtures
//! written by `fixtures/gen.py` (torch's float32 results). Runs on every device in
//! `common::devices()`.

mod common;

use common::{assert_close, devices};
use kiln_autograd::{Device, Result, Tensor};
use serde_json::Value;

fn tensor(v: &Value, device: Device) -> Tensor {
    let shape: Vec<usize> = v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    let data: Vec<f32> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    Tensor::from_vec(data, &shape, device).unwrap()
}

fn values(v: &Value) -> Vec<f64> {
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn apply(op: &str, args: &Value, x: &[Tensor]) -> Result<Tensor> {
    let dim = args.get("dim").and_then(Value::as_i64).unwrap_or(0) as isize;
    match op {
        "matmul" => x[0].matmul(&x[1]),
        "softmax" => x[0].softmax(dim),
        "log_softmax" => x[0].log_softmax(dim),
        "gelu" => x[0].gelu(),
        "gelu_tanh" => x[0].gelu_tanh(),
        "silu" => x[0].silu(),
        "sigmoid" => x[0].sigmoid(),
        "tanh" => x[0].tanh(),
        "var" => x[0].var(&[dim], 1, false),
        "logsumexp" => x[0].logsumexp(&[dim], false),
        "norm" => x[0].norm(2.0, &[dim], false),
        other => panic!("fixture op {other} has no kiln mapping"),
    }
}

#[test]
fn forward_and_backward_match_pytorch() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/parity.json"
    ))
    .unwrap();
    let fixtures: Value = serde_json::from_str(&text).unwrap();
    let cases = fixtures["cases"].as_array().unwrap();
    assert!(cases.len() >= 20);
    for dev in devices() {
        for case in cases {
            let name = case["name"].as_str().unwrap();
            let inputs: Vec<Tensor> = case["inputs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| {
                    let t = tensor(v, dev);
                    t.set_requires_grad(true).unwrap();
                    t
                })
                .collect();
            let out = apply(case["op"].as_str().unwrap(), &case["args"], &inputs).unwrap();
            assert_eq!(
                out.shape(),
                tensor(&case["out"], Device::Cpu).shape(),
                "{name}: output shape"
            );
            assert_close(
                name,
                &out.to_vec_f64().unwrap(),
                &values(&case["out"]),
                2e-5,
            );
            let grad_out = tensor(&case["grad_out"], dev);
            out.backward_with(Some(&grad_out), false).unwrap();
            for (i, (x, want)) in inputs
                .iter()
                .zip(case["grads"].as_array().unwrap())
                .enumerate()
            {
                let got = x.grad().unwrap().to_vec_f64().unwrap();
                assert_close(&format!("{name}: grad {i}"), &got, &values(want), 2e-5);
            }
        }
    }
}
