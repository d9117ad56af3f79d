//! `add_scaled_` (PyTorch's `x.add_(y, alpha=alpha)`) against PyTorch bit for bit: one fused
//! multiply-add per element, rounded once (f16/bf16 with alpha rounded to the dtype, fused in
//! f32), into a contiguous and a transposed destination, in the four float dtypes, on every
//! device in `common::devices()`. Fixtures: `fixtures/add_scaled.json`, written by
//! `fixtures/gen_add_scaled.py` (whose docstring says why the transposed cases expect PyTorch's
//! contiguous kernel).

mod common;

use common::devices;
use kiln_autograd::{DType, Device, Tensor};
use serde_json::Value;

/// The values of bit patterns of `dtype`, exactly, as f64.
fn decode(bits: &[u64], dtype: DType) -> Vec<f64> {
    bits.iter()
        .map(|&b| match dtype {
            DType::F64 => f64::from_bits(b),
            DType::F32 => f64::from(f32::from_bits(b as u32)),
            DType::F16 => half::f16::from_bits(b as u16).to_f64(),
            DType::BF16 => f64::from(f32::from_bits((b as u32) << 16)),
            other => panic!("no float bits for {other}"),
        })
        .collect()
}

fn dtype_of(name: &str) -> DType {
    match name {
        "float64" => DType::F64,
        "float32" => DType::F32,
        "float16" => DType::F16,
        "bfloat16" => DType::BF16,
        other => panic!("fixture dtype {other}"),
    }
}

fn numbers(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_u64().unwrap())
        .collect()
}

#[test]
fn add_scaled_matches_pytorch_bit_for_bit() {
    // Embedded, so the packed test binary runs on a GPU machine without the source tree.
    let fixtures: Value = serde_json::from_str(include_str!("fixtures/add_scaled.json")).unwrap();
    let cases = fixtures["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 16);
    for dev in devices() {
        for case in cases {
            let dtype = dtype_of(case["dtype"].as_str().unwrap());
            let shape: Vec<usize> = numbers(&case["shape"])
                .iter()
                .map(|&d| d as usize)
                .collect();
            let alpha = case["alpha"].as_f64().unwrap();
            let view = case["view"].as_str().unwrap();
            let what = format!("{dev} {dtype} alpha {alpha} {view}");
            let values = |key: &str| decode(&numbers(&case[key]), dtype);
            let (x, y, want) = (values("x"), values("y"), values("out"));
            let tensor = |v: &[f64]| {
                Tensor::from_slice(v, &shape, Device::Cpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap()
                    .to_device(dev)
                    .unwrap()
            };
            let x_t = tensor(&x);
            // The transposed destination: a [cols, rows] buffer seen through `.t()`.
            let dst = match view {
                "t" => x_t.t().unwrap().copy_data().unwrap().t().unwrap(),
                _ => x_t,
            };
            assert_eq!(dst.is_contiguous(), view != "t", "{what}");
            dst.add_scaled_(&tensor(&y), alpha).unwrap();
            let got = dst.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{what}: element {i}: {g} vs {w}");
            }
            if dtype == DType::F32 {
                // The fixture tells a fused update from `x + round(alpha * y)`.
                let a = alpha as f32;
                let unfused = x
                    .iter()
                    .zip(&y)
                    .zip(&want)
                    .filter(|((&x, &y), &w)| f64::from(x as f32 + a * y as f32) != w)
                    .count();
                assert!(unfused > 0, "{what}: no element tells fused from unfused");
            }
        }
    }
}
