//! PyTorch parity: forward values and gradients of matmul (with batch broadcasting and 1-D
//! operands), softmax, log_softmax, a few unary ops and reductions, conv2d, the poolings,
//! batch_norm (with its running-statistics update) and layer_norm, in f32, against fixtures
//! written by `fixtures/gen.py` (torch's float32 results). Runs on every device in
//! `common::devices()`.

mod common;

use common::{assert_close, devices};
use kiln_autograd::{
    AvgPool2dParams, BatchNormOptions, Conv2dParams, Device, MaxPool2dParams, Result, Tensor,
};
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

fn pair(args: &Value, key: &str) -> [usize; 2] {
    let v = args[key]
        .as_array()
        .unwrap_or_else(|| panic!("missing {key}"));
    [
        v[0].as_u64().unwrap() as usize,
        v[1].as_u64().unwrap() as usize,
    ]
}

fn flag(args: &Value, key: &str) -> bool {
    args[key]
        .as_bool()
        .unwrap_or_else(|| panic!("missing {key}"))
}

/// Batch norm of a fixture case: runs it with the fixture's running statistics and checks
/// their in-place update against torch's.
fn batch_norm_case(case: &Value, x: &[Tensor], device: Device) -> Result<Tensor> {
    let args = &case["args"];
    let running: Vec<Tensor> = case["running"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| tensor(v, device))
        .collect();
    let options = BatchNormOptions {
        training: flag(args, "training"),
        momentum: args["momentum"].as_f64().unwrap(),
        eps: args["eps"].as_f64().unwrap(),
    };
    let out = x[0].batch_norm(
        Some(&running[0]),
        Some(&running[1]),
        x.get(1),
        x.get(2),
        options,
    )?;
    for (i, (r, want)) in running
        .iter()
        .zip(case["running_after"].as_array().unwrap())
        .enumerate()
    {
        assert_close(
            &format!("{}: running stat {i}", case["name"]),
            &r.to_vec_f64().unwrap(),
            &values(want),
            2e-6,
        );
    }
    Ok(out)
}

fn apply(case: &Value, x: &[Tensor], device: Device) -> Result<Tensor> {
    let (op, args) = (case["op"].as_str().unwrap(), &case["args"]);
    let dim = args.get("dim").and_then(Value::as_i64).unwrap_or(0) as isize;
    match op {
        "conv2d" => {
            let params = Conv2dParams {
                stride: pair(args, "stride"),
                padding: pair(args, "padding"),
                dilation: pair(args, "dilation"),
                groups: args["groups"].as_u64().unwrap() as usize,
            };
            x[0].conv2d(&x[1], x.get(2), params)
        }
        "max_pool2d" => x[0].max_pool2d(MaxPool2dParams {
            kernel_size: pair(args, "kernel"),
            stride: pair(args, "stride"),
            padding: pair(args, "padding"),
            dilation: pair(args, "dilation"),
            ceil_mode: flag(args, "ceil_mode"),
        }),
        "avg_pool2d" => x[0].avg_pool2d(AvgPool2dParams {
            kernel_size: pair(args, "kernel"),
            stride: pair(args, "stride"),
            padding: pair(args, "padding"),
            ceil_mode: flag(args, "ceil_mode"),
            count_include_pad: flag(args, "count_include_pad"),
            divisor_override: None,
        }),
        "adaptive_avg_pool2d" => x[0].adaptive_avg_pool2d(pair(args, "output_size")),
        "batch_norm" => batch_norm_case(case, x, device),
        "layer_norm" => {
            let shape: Vec<usize> = args["normalized_shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            x[0].layer_norm(&shape, x.get(1), x.get(2), args["eps"].as_f64().unwrap())
        }
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
    // Embedded, so the packed test binary runs on a GPU machine without the source tree.
    let text = include_str!("fixtures/parity.json");
    let fixtures: Value = serde_json::from_str(text).unwrap();
    let cases = fixtures["cases"].as_array().unwrap();
    assert!(cases.len() >= 44);
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
            let out = apply(case, &inputs, dev).unwrap();
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
