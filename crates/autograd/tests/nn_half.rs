//! The neural-network and indexing ops on `F16`/`BF16` tensors: the CPU computes in `f32` and
//! rounds once, so results and gradients match the `f32` ones to half precision.

mod common;

use common::assert_close;
use kiln_autograd::{
    AvgPool2dParams, BatchNormOptions, Conv2dParams, DType, Device, Generator, MaxPool2dParams,
    Result, Tensor,
};

type Op = fn(&[Tensor]) -> Result<Tensor>;

/// Runs `op` on f32 inputs and on the same inputs rounded to `dtype`; compares outputs and
/// input gradients.
fn compare(name: &str, dtype: DType, shapes: &[&[usize]], op: Op) {
    let mut g = Generator::new(9);
    let wide: Vec<Tensor> = shapes
        .iter()
        .map(|s| {
            // Start from values representable in `dtype`, so both runs see the same inputs.
            g.normal(s, 0.0, 1.0, dtype, Device::Cpu)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
        })
        .collect();
    let narrow: Vec<Tensor> = wide.iter().map(|t| t.to_dtype(dtype).unwrap()).collect();
    for t in wide.iter().chain(&narrow) {
        t.set_requires_grad(true).unwrap();
    }
    let (a, b) = (op(&wide).unwrap(), op(&narrow).unwrap());
    assert_eq!(b.dtype(), dtype, "{name}: output dtype");
    let tol = if dtype == DType::BF16 { 3e-2 } else { 4e-3 };
    assert_close(
        name,
        &b.to_vec_f64().unwrap(),
        &a.to_vec_f64().unwrap(),
        tol,
    );
    a.sum_all().unwrap().backward().unwrap();
    b.to_dtype(DType::F32)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    for (i, (w, n)) in wide.iter().zip(&narrow).enumerate() {
        let gn = n.grad().unwrap();
        assert_eq!(gn.dtype(), dtype, "{name}: grad {i} dtype");
        assert_close(
            &format!("{name}: grad {i}"),
            &gn.to_vec_f64().unwrap(),
            &w.grad().unwrap().to_vec_f64().unwrap(),
            tol * 4.0,
        );
    }
}

#[test]
fn half_types_compute_through_f32() {
    let cases: Vec<(&str, Vec<&[usize]>, Op)> = vec![
        ("conv2d", vec![&[2, 3, 6, 6], &[4, 3, 3, 3], &[4]], |t| {
            let p = Conv2dParams {
                padding: [1, 1],
                ..Conv2dParams::default()
            };
            t[0].conv2d(&t[1], Some(&t[2]), p)
        }),
        ("max_pool2d", vec![&[1, 2, 6, 6]], |t| {
            t[0].max_pool2d(MaxPool2dParams::new([2, 2]))
        }),
        ("avg_pool2d", vec![&[1, 2, 6, 6]], |t| {
            t[0].avg_pool2d(AvgPool2dParams::new([3, 3]))
        }),
        ("adaptive_avg_pool2d", vec![&[1, 2, 7, 5]], |t| {
            t[0].adaptive_avg_pool2d([2, 2])
        }),
        ("batch_norm", vec![&[4, 3, 3], &[3], &[3]], |t| {
            t[0].batch_norm(
                None,
                None,
                Some(&t[1]),
                Some(&t[2]),
                BatchNormOptions::default(),
            )
        }),
        ("layer_norm", vec![&[3, 8], &[8], &[8]], |t| {
            t[0].layer_norm(&[8], Some(&t[1]), Some(&t[2]), 1e-5)
        }),
        ("index_select", vec![&[4, 3]], |t| {
            t[0].index_select(0, &Tensor::from_slice(&[3i64, 0, 3], &[3], Device::Cpu)?)
        }),
        ("embedding", vec![&[5, 2]], |t| {
            let idx = Tensor::from_slice(&[4i64, 1, 1, 0], &[2, 2], Device::Cpu)?;
            Tensor::embedding(&idx, &t[0], None)
        }),
        ("gather_scatter_add", vec![&[2, 4], &[2, 3]], |t| {
            let idx = Tensor::from_slice(&[0i64, 3, 3, 1, 1, 2], &[2, 3], Device::Cpu)?;
            t[0].scatter_add(1, &idx, &t[1])?.gather(1, &idx)
        }),
    ];
    for dtype in [DType::F16, DType::BF16] {
        for (name, shapes, op) in &cases {
            compare(&format!("{name} {dtype}"), dtype, shapes, *op);
        }
    }
}

#[test]
fn half_running_statistics_are_updated_in_place() {
    let x = Generator::new(3)
        .normal(&[6, 2], 1.0, 2.0, DType::F32, Device::Cpu)
        .unwrap();
    let run = |dtype: DType| {
        let (m, v) = (
            Tensor::zeros(&[2], dtype, Device::Cpu).unwrap(),
            Tensor::ones(&[2], dtype, Device::Cpu).unwrap(),
        );
        x.to_dtype(dtype)
            .unwrap()
            .batch_norm(Some(&m), Some(&v), None, None, BatchNormOptions::default())
            .unwrap();
        assert_eq!((m.version(), v.version()), (1, 1), "{dtype}: updated once");
        (m.to_vec_f64().unwrap(), v.to_vec_f64().unwrap())
    };
    let (m32, v32) = run(DType::F32);
    assert!(m32.iter().all(|&m| m != 0.0));
    for dtype in [DType::F16, DType::BF16] {
        let (m, v) = run(dtype);
        assert_close(&format!("running_mean {dtype}"), &m, &m32, 1e-2);
        assert_close(&format!("running_var {dtype}"), &v, &v32, 1e-2);
    }
}
