//! Clipping semantics: the scale pass skipped (and nothing marked written) when not clipping,
//! non-finite norms named, strided and shared gradients, half types, the coefficient handed to
//! the step, and the CUDA path against the CPU's.

mod common;
use common::{grad, named, param};
use kiln_autograd::{DType, Device, Parameter, Tensor};
use kiln_optim::{
    clip_coef_for, clip_grad_norm_, clip_grad_value_, get_total_norm, Error, Optimizer, ParamGroup,
    Sgd, SgdOptions,
};

#[test]
fn clip_skips_the_scale_pass_when_not_clipping_and_names_nonfinite_params() {
    let (a, b, none) = (param(&[0.0; 2]), param(&[0.0; 2]), param(&[0.0]));
    grad(&a, &[3.0, 0.0]);
    grad(&b, &[0.0, 4.0]);
    let ps = vec![
        ("a".to_string(), a.clone()),
        ("b".to_string(), b.clone()),
        ("none".to_string(), none.clone()),
    ];
    let version = a.grad().unwrap().version();
    assert_eq!(clip_grad_norm_(&ps, 10.0, 2.0, false).unwrap(), 5.0);
    assert_eq!(
        a.grad().unwrap().version(),
        version,
        "no write when coef >= 1"
    );
    assert_eq!(clip_grad_norm_(&ps, 1.0, 2.0, false).unwrap(), 5.0);
    assert_eq!(
        a.grad().unwrap().version(),
        version + 1,
        "one write when scaling"
    );
    let scaled = a.grad().unwrap().to_vec::<f32>().unwrap()[0];
    assert_eq!(scaled, 3.0 * (1.0 / (5.0 + 1e-6)) as f32);
    assert_eq!(
        get_total_norm(&[b.grad().unwrap()], f64::INFINITY, false).unwrap(),
        b.grad().unwrap().to_vec::<f32>().unwrap()[1] as f64
    );
    // Non-finite: an error naming the first bad parameter, or PyTorch's NaN scaling.
    grad(&b, &[f32::NAN, 1.0]);
    let err = clip_grad_norm_(&ps, 1.0, 2.0, true).unwrap_err();
    assert!(
        matches!(&err, Error::NonFiniteNorm { name, .. } if name == "b"),
        "{err}"
    );
    assert!(clip_grad_norm_(&ps, 1.0, 2.0, false).unwrap().is_nan());
    assert!(a
        .grad()
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .all(|x| x.is_nan()));
    grad(&a, &[f32::INFINITY, 1.0]);
    grad(&b, &[1.0, 1.0]);
    assert_eq!(
        clip_grad_norm_(&ps, 1.0, 2.0, false).unwrap(),
        f64::INFINITY
    );
    assert_eq!(b.grad().unwrap().to_vec::<f32>().unwrap(), vec![0.0, 0.0]);
    assert!(clip_grad_norm_(&ps, 1.0, f64::NAN, false)
        .unwrap_err()
        .to_string()
        .contains("NaN"));
    // A hostile max_norm or clip_value is echoed in short form, not as 301 digits.
    let e = clip_grad_norm_(&ps, -1e300, 2.0, false).unwrap_err();
    assert!(e.to_string().contains("max_norm is -1e300;"), "{e}");
    let e = clip_grad_value_(&ps, -1e300).unwrap_err();
    assert!(e.to_string().contains("clip_value is -1e300;"), "{e}");
    // No gradients at all: total 0.
    assert_eq!(
        clip_grad_norm_(&[("n".to_string(), none)], 1.0, 2.0, true).unwrap(),
        0.0
    );
}

#[test]
fn clipping_reaches_strided_views_and_shared_buffers_and_half_types() {
    let p = Parameter::new(Tensor::zeros(&[3, 2], DType::F32, Device::Cpu).unwrap()).unwrap();
    let base = Tensor::from_vec(vec![1f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], Device::Cpu).unwrap();
    p.set_grad(Some(base.t().unwrap())).unwrap(); // a transposed (strided) view
    let q = Parameter::new(Tensor::zeros(&[2], DType::F32, Device::Cpu).unwrap()).unwrap();
    let r = Parameter::new(Tensor::zeros(&[2], DType::F32, Device::Cpu).unwrap()).unwrap();
    let flat = Tensor::from_vec(vec![1f32, 1.0, 1.0, 1.0, 9.0], &[5], Device::Cpu).unwrap();
    q.set_grad(Some(flat.narrow(0, 0, 2).unwrap())).unwrap(); // two views of one buffer,
    r.set_grad(Some(flat.narrow(0, 3, 2).unwrap())).unwrap(); // the second one unaligned
    let h = Parameter::new(Tensor::zeros(&[4], DType::F16, Device::Cpu).unwrap()).unwrap();
    h.set_grad(Some(
        Tensor::from_vec(vec![half::f16::from_f32(300.0); 4], &[4], Device::Cpu).unwrap(),
    ))
    .unwrap();
    let ps = vec![
        ("p".into(), p.clone()),
        ("q".into(), q.clone()),
        ("r".into(), r.clone()),
        ("h".into(), h.clone()),
    ];
    // Not clipping leaves the copied (strided, shared) gradients' buffers unmarked too.
    let versions = (base.version(), flat.version());
    clip_grad_norm_(&ps, 1e9, 2.0, false).unwrap();
    assert_eq!((base.version(), flat.version()), versions);
    let total = clip_grad_norm_(&ps, 1.0, 2.0, false).unwrap();
    assert!(base.version() > versions.0 && flat.version() > versions.1);
    let want = (91.0f64 + 2.0 + 82.0 + 4.0 * 90_000.0).sqrt();
    assert!((total - want).abs() < 1e-9 * want, "{total} vs {want}");
    let coef = (1.0 / (want + 1e-6)) as f32;
    assert_eq!(base.to_vec::<f32>().unwrap()[5], 6.0 * coef);
    assert_eq!(
        flat.to_vec::<f32>().unwrap(),
        vec![coef, coef, 1.0, coef, 9.0 * coef]
    );
    clip_grad_value_(&ps, 0.001).unwrap();
    assert_eq!(flat.to_vec::<f32>().unwrap()[4], 0.001);
}

#[test]
fn handing_the_clip_coef_to_the_step_equals_clip_then_step() {
    let make = || (param(&[0.5, -1.0, 2.0]), param(&[3.0; 5]));
    let ((a1, b1), (a2, b2)) = (make(), make());
    let g = |p: &Parameter, k: f32| {
        grad(
            p,
            &(0..p.numel())
                .map(|i| (i as f32 + k) * 1.7)
                .collect::<Vec<_>>(),
        )
    };
    let opts = SgdOptions::default().lr(0.1).momentum(0.9);
    let mut o1 = Sgd::new(vec![ParamGroup::new(named(&[&a1, &b1], "p"))], opts).unwrap();
    let mut o2 = Sgd::new(vec![ParamGroup::new(named(&[&a2, &b2], "p"))], opts).unwrap();
    for step in 0..3 {
        for p in [&a1, &b1, &a2, &b2] {
            g(p, step as f32);
        }
        let total = clip_grad_norm_(&o1.named_params(), 1.0, 2.0, false).unwrap();
        o1.step().unwrap();
        let info = clip_coef_for(&o2.named_params(), 1.0, 2.0, false).unwrap();
        assert_eq!(info.total_norm, total);
        assert!(info.coef < 1.0);
        o2.step_with_grad_scale(info.coef).unwrap();
    }
    assert_eq!(a1.to_vec::<f32>().unwrap(), a2.to_vec::<f32>().unwrap());
    assert_eq!(b1.to_vec::<f32>().unwrap(), b2.to_vec::<f32>().unwrap());
}

#[test]
fn get_total_norm_names_the_first_nonfinite_tensor_and_value_clipping_keeps_nan() {
    let ok = Tensor::from_vec(vec![3f32, 4.0], &[2], Device::Cpu).unwrap();
    let bad = Tensor::from_vec(vec![f32::INFINITY], &[1], Device::Cpu).unwrap();
    assert_eq!(
        get_total_norm(std::slice::from_ref(&ok), 2.0, true).unwrap(),
        5.0
    );
    assert_eq!(get_total_norm(&[], 2.0, true).unwrap(), 0.0);
    let err = get_total_norm(&[ok.clone(), bad.clone(), bad], 2.0, true).unwrap_err();
    assert!(err.to_string().contains("`tensor[1]`"), "{err}");
    assert_eq!(
        get_total_norm(std::slice::from_ref(&ok), 1.0, false).unwrap(),
        7.0
    );
    assert_eq!(
        get_total_norm(&[ok], 0.0, false).unwrap(),
        1.0,
        "count of nonzero norms"
    );
    let p = param(&[0.0; 3]);
    grad(&p, &[f32::NAN, -5.0, 0.25]);
    clip_grad_value_(&[("p".into(), p.clone())], 1.0).unwrap();
    let g = p.grad().unwrap().to_vec::<f32>().unwrap();
    assert!(g[0].is_nan());
    assert_eq!(&g[1..], &[-1.0, 0.25]);
}

#[test]
fn clip_on_a_cuda_device_matches_the_cpu() {
    let Some(dev) = kiln_device::testing::cuda_device_or_skip() else {
        return;
    };
    let lens = [12usize, 1, 70_001, 3];
    let host: Vec<Vec<f32>> = lens
        .iter()
        .map(|&n| (0..n).map(|i| ((i % 13) as f32 - 6.0) * 0.5).collect())
        .collect();
    let mk = |device: Device| -> Vec<(String, Parameter)> {
        host.iter()
            .enumerate()
            .map(|(i, h)| {
                let p =
                    Parameter::new(Tensor::zeros(&[h.len()], DType::F32, device).unwrap()).unwrap();
                p.set_grad(Some(
                    Tensor::from_vec(h.clone(), &[h.len()], Device::Cpu)
                        .unwrap()
                        .to_device(device)
                        .unwrap(),
                ))
                .unwrap();
                (format!("g{i}"), p)
            })
            .collect()
    };
    let (cpu, gpu) = (mk(Device::Cpu), mk(dev));
    for max_norm in [1e9, 1.0] {
        let want = clip_grad_norm_(&cpu, max_norm, 2.0, false).unwrap();
        let got = clip_grad_norm_(&gpu, max_norm, 2.0, false).unwrap();
        assert!((got - want).abs() <= 1e-5 * want, "{got} vs {want}");
    }
    for ((_, a), (_, b)) in cpu.iter().zip(&gpu) {
        let (a, b) = (
            a.grad().unwrap().to_vec::<f32>().unwrap(),
            b.grad().unwrap().to_vec::<f32>().unwrap(),
        );
        assert!(a
            .iter()
            .zip(&b)
            .all(|(x, y)| (x - y).abs() <= 1e-5 * (1.0 + x.abs())));
    }
    gpu[1]
        .1
        .set_grad(Some(
            Tensor::from_vec(vec![f32::NAN], &[1], Device::Cpu)
                .unwrap()
                .to_device(dev)
                .unwrap(),
        ))
        .unwrap();
    let err = clip_grad_norm_(&gpu, 1.0, 2.0, true).unwrap_err();
    assert!(
        matches!(&err, Error::NonFiniteNorm { name, .. } if name == "g1"),
        "{err}"
    );
}
