//! PyTorch parity: values and gradients of every loss and option combination, against
//! `fixtures/losses.json` (written by `fixtures/gen_losses.py`), on the CPU and, when a device
//! is usable, on `cuda:0` (the same cases and tolerances; skipped with a reason otherwise).

mod common;

use common::{assert_close, tensor};
use kiln_autograd::{DType, Device, Tensor};
use kiln_losses::*;
use serde_json::Value;

fn reduction(opts: &Value) -> Reduction {
    match opts["reduction"].as_str().unwrap_or("mean") {
        "none" => Reduction::None,
        "mean" => Reduction::Mean,
        "sum" => Reduction::Sum,
        _ => Reduction::Mean, // kl_div's own enum is read in `call`
    }
}

/// The fixture tensor at `v` on `device`.
fn on(v: &Value, device: Device) -> Option<Tensor> {
    tensor(v).map(|t| t.to_device(device).unwrap())
}

/// Runs the case's loss on `input`/`target` (class weights moved to `device`).
fn call(case: &Value, input: &Tensor, target: &Tensor, device: Device) -> Result<Tensor> {
    let opts = &case["options"];
    let weight = on(&case["weight"], device);
    let pos_weight = on(&case["pos_weight"], device);
    let ignore_index = opts["ignore_index"].as_i64().unwrap_or(-100);
    let red = reduction(opts);
    match case["fn"].as_str().unwrap() {
        "cross_entropy" => cross_entropy(
            input,
            target,
            &CrossEntropyOptions {
                weight: weight.as_ref(),
                ignore_index,
                reduction: red,
                label_smoothing: opts["label_smoothing"].as_f64().unwrap_or(0.0),
            },
        ),
        "nll_loss" => nll_loss(
            input,
            target,
            &NllLossOptions {
                weight: weight.as_ref(),
                ignore_index,
                reduction: red,
            },
        ),
        "mse_loss" => mse_loss(input, target, red),
        "l1_loss" => l1_loss(input, target, red),
        "smooth_l1_loss" => smooth_l1_loss(input, target, red, opts["beta"].as_f64().unwrap()),
        "huber_loss" => huber_loss(input, target, red, opts["delta"].as_f64().unwrap()),
        "binary_cross_entropy" => binary_cross_entropy(
            input,
            target,
            &BceOptions {
                weight: weight.as_ref(),
                reduction: red,
            },
        ),
        "binary_cross_entropy_with_logits" => binary_cross_entropy_with_logits(
            input,
            target,
            &BceWithLogitsOptions {
                weight: weight.as_ref(),
                pos_weight: pos_weight.as_ref(),
                reduction: red,
            },
        ),
        "kl_div" => {
            let red = match opts["reduction"].as_str().unwrap() {
                "none" => KlDivReduction::None,
                "mean" => KlDivReduction::Mean,
                "sum" => KlDivReduction::Sum,
                "batchmean" => KlDivReduction::BatchMean,
                other => panic!("kl reduction {other}"),
            };
            kl_div(input, target, red, opts["log_target"].as_bool().unwrap())
        }
        other => panic!("unknown fn {other}"),
    }
}

#[test]
fn every_loss_matches_pytorch_values_and_gradients() {
    every_loss_matches_pytorch_on(Device::Cpu);
}

#[test]
fn every_loss_matches_pytorch_on_cuda() {
    if let Some(cuda) = kiln_device::testing::cuda_device_or_skip() {
        every_loss_matches_pytorch_on(cuda);
    }
}

fn every_loss_matches_pytorch_on(device: Device) {
    let text = include_str!("fixtures/losses.json");
    let root: Value = serde_json::from_str(text).unwrap();
    let cases = root["cases"].as_array().unwrap();
    assert!(cases.len() >= 100, "fixture holds {} cases", cases.len());
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let input = on(&case["input"], device).unwrap();
        let target = on(&case["target"], device).unwrap();
        let f32_case = input.dtype() == DType::F32;
        let (atol, rtol) = if f32_case {
            (1e-3, 1e-5)
        } else {
            (1e-12, 1e-10)
        };
        input.set_requires_grad(true).unwrap();
        let target_grad = !case["grad_target"].is_null();
        if target_grad {
            target.set_requires_grad(true).unwrap();
        }
        let out = call(case, &input, &target, device)
            .unwrap_or_else(|e| panic!("{name} on {device}: {e}"));
        assert_eq!(out.device(), device, "{name}");
        assert_close(
            &format!("{name} output"),
            &out,
            &tensor(&case["output"]).unwrap(),
            atol,
            rtol,
        );
        // The output's gradient lives where the output does (as PyTorch requires).
        let g = on(&case["grad_output"], device).unwrap();
        out.backward_with(Some(&g), false)
            .unwrap_or_else(|e| panic!("{name}: backward: {e}"));
        assert_close(
            &format!("{name} grad_input"),
            &input.grad().unwrap(),
            &tensor(&case["grad_input"]).unwrap(),
            atol,
            rtol,
        );
        if target_grad {
            assert_close(
                &format!("{name} grad_target"),
                &target
                    .grad()
                    .unwrap_or_else(|| panic!("{name}: no target grad")),
                &tensor(&case["grad_target"]).unwrap(),
                atol,
                rtol,
            );
        }
    }
}
