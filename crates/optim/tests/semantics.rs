//! Behaviour tests: parameter groups, frozen parameters, state dicts, clipping semantics,
//! the grad-scale hand-off and GradScaler.

use kiln_autograd::{no_grad, DType, Device, Parameter, Tensor};
use kiln_optim::{
    clip_coef_for, clip_grad_norm_, clip_grad_value_, get_total_norm, AdamOptions, AdamW, Error,
    GradScaler, GradScalerOptions, Optimizer, ParamGroup, Sgd, SgdOptions, StateDict,
};

fn param(values: &[f32]) -> Parameter {
    Parameter::new(Tensor::from_vec(values.to_vec(), &[values.len()], Device::Cpu).unwrap())
        .unwrap()
}

fn grad(p: &Parameter, values: &[f32]) {
    p.set_grad(Some(
        Tensor::from_vec(values.to_vec(), &[values.len()], Device::Cpu).unwrap(),
    ))
    .unwrap();
}

fn named(ps: &[&Parameter], prefix: &str) -> Vec<(String, Parameter)> {
    ps.iter()
        .enumerate()
        .map(|(i, p)| (format!("{prefix}.{i}"), (*p).clone()))
        .collect()
}

#[test]
fn fine_tuning_groups_inherit_defaults_and_take_their_own_lr() {
    let (w, b, head) = (param(&[1.0, 2.0]), param(&[0.5]), param(&[-1.0, 3.0]));
    let mut opt = AdamW::new(
        vec![
            ParamGroup::new(named(&[&w, &b], "backbone")).lr(1e-5),
            ParamGroup::new(named(&[&head], "classifier")).lr(1e-3),
        ],
        AdamOptions::adamw().weight_decay(1e-4),
    )
    .unwrap();
    assert_eq!(opt.num_groups(), 2);
    assert_eq!((opt.lr(0).unwrap(), opt.lr(1).unwrap()), (1e-5, 1e-3));
    assert_eq!(opt.options(0).unwrap().weight_decay, 1e-4);
    assert_eq!(opt.options(1).unwrap().weight_decay, 1e-4);
    assert_eq!(opt.momentum(1).unwrap(), Some(0.9));
    opt.set_lr(1, 2e-3).unwrap();
    opt.set_momentum(1, 0.85).unwrap();
    assert_eq!(opt.betas(1).unwrap(), Some((0.85, 0.999)));
    assert!(opt
        .lr(2)
        .unwrap_err()
        .to_string()
        .contains("group 2 does not exist"));
    // First Adam step moves each element by ~lr (|m/sqrt(v)| = 1), after decoupled decay.
    for p in [&w, &b, &head] {
        grad(p, &vec![1.0; p.numel()]);
    }
    opt.step().unwrap();
    let moved = |p: &Parameter, before: f32, lr: f64| {
        let after = p.to_vec::<f32>().unwrap()[0] as f64;
        let want = before as f64 * (1.0 - lr * 1e-4) - lr;
        assert!((after - want).abs() < 1e-6, "{after} vs {want}");
    };
    moved(&w, 1.0, 1e-5);
    moved(&head, -1.0, 2e-3);
}

#[test]
fn group_errors_name_the_problem() {
    let (a, b) = (param(&[1.0]), param(&[2.0]));
    let twice = Sgd::new(
        vec![
            ParamGroup::new(vec![("enc.weight".into(), a.clone())]),
            ParamGroup::new(vec![
                ("enc.weight_again".into(), a.clone()),
                ("b".into(), b.clone()),
            ]),
        ],
        SgdOptions::default(),
    );
    let msg = twice.err().unwrap().to_string();
    assert!(
        msg.contains("`enc.weight_again`") && msg.contains("more than one parameter group"),
        "{msg}"
    );
    let empty = Sgd::new(vec![ParamGroup::new(vec![])], SgdOptions::default());
    assert!(empty
        .err()
        .unwrap()
        .to_string()
        .contains("group 0 is empty"));
    let wrong = Sgd::new(
        vec![ParamGroup::new(named(&[&a], "x")).betas((0.9, 0.9))],
        SgdOptions::default(),
    );
    assert!(wrong.err().unwrap().to_string().contains("`betas`"));
    let bad_beta = AdamW::new(
        vec![ParamGroup::new(named(&[&a], "x"))],
        AdamOptions::adamw().betas((1.0, 0.9)),
    );
    assert!(bad_beta
        .err()
        .unwrap()
        .to_string()
        .contains("betas must be in [0, 1)"));
    let nesterov = Sgd::new(
        vec![ParamGroup::new(named(&[&a], "x"))],
        SgdOptions::default().nesterov(true),
    );
    assert!(nesterov.err().unwrap().to_string().contains("Nesterov"));
    // add_param_group works, and refuses a parameter already present.
    let mut opt = Sgd::new(
        vec![ParamGroup::new(named(&[&a], "a"))],
        SgdOptions::default().lr(0.5),
    )
    .unwrap();
    opt.add_param_group(ParamGroup::new(named(&[&b], "b")).lr(0.25))
        .unwrap();
    assert_eq!(opt.lr(1).unwrap(), 0.25);
    assert!(opt
        .add_param_group(ParamGroup::new(named(&[&b], "b2")))
        .is_err());
    grad(&b, &[4.0]);
    opt.step().unwrap();
    assert_eq!(b.to_vec::<f32>().unwrap(), vec![1.0]);
}

#[test]
fn frozen_and_gradless_parameters_are_skipped_and_get_no_state() {
    let (live, frozen, idle) = (param(&[1.0]), param(&[1.0]), param(&[1.0]));
    let mut opt = AdamW::new(
        vec![ParamGroup::new(named(&[&live, &frozen, &idle], "p"))],
        AdamOptions::adamw(),
    )
    .unwrap();
    grad(&live, &[1.0]);
    grad(&frozen, &[1.0]);
    frozen.set_requires_grad(false).unwrap();
    opt.step().unwrap();
    assert!(opt.has_state(&live));
    assert!(!opt.has_state(&frozen) && !opt.has_state(&idle));
    assert_eq!(frozen.to_vec::<f32>().unwrap(), vec![1.0]);
    assert_eq!(idle.to_vec::<f32>().unwrap(), vec![1.0]);
    assert_eq!(opt.state_of(&live).unwrap().step, 1);
    opt.zero_grad(false).unwrap();
    assert_eq!(live.grad().unwrap().to_vec::<f32>().unwrap(), vec![0.0]);
    opt.zero_grad(true).unwrap();
    assert!(live.grad().is_none());
}

fn run_steps(opt: &mut dyn Optimizer, ps: &[Parameter], from: usize, to: usize) {
    for step in from..to {
        for (i, p) in ps.iter().enumerate() {
            let v: Vec<f32> = p
                .to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|x| (x * (i as f32 + 1.0) + step as f32).sin())
                .collect();
            grad(p, &v);
        }
        opt.step().unwrap();
    }
}

#[test]
fn a_resumed_run_continues_bit_identically() {
    let make = || vec![param(&[0.3, -0.2, 0.9]), param(&[1.5; 70_000])];
    let opts = AdamOptions::adamw().amsgrad(true).lr(0.01);
    // Reference: ten uninterrupted steps.
    let d = make();
    let mut full = AdamW::new(
        vec![ParamGroup::new(named(&d.iter().collect::<Vec<_>>(), "p"))],
        opts,
    )
    .unwrap();
    run_steps(&mut full, &d, 0, 10);
    // Five steps, a state dict through JSON, then five more in a fresh optimizer.
    let b = make();
    let mut first = AdamW::new(
        vec![ParamGroup::new(named(&b.iter().collect::<Vec<_>>(), "p"))],
        opts,
    )
    .unwrap();
    run_steps(&mut first, &b, 0, 5);
    let saved = serde_json::to_string(&first.state_dict().unwrap()).unwrap();
    let c = make();
    no_grad(|| {
        for (dst, src) in c.iter().zip(&b) {
            dst.copy_(src).unwrap();
        }
    });
    // Built with another lr, which the state dict's group options override.
    let mut resumed = AdamW::new(
        vec![ParamGroup::new(named(&c.iter().collect::<Vec<_>>(), "p")).lr(0.5)],
        opts,
    )
    .unwrap();
    resumed
        .load_state_dict(&serde_json::from_str::<StateDict>(&saved).unwrap())
        .unwrap();
    assert_eq!(resumed.lr(0).unwrap(), 0.01);
    run_steps(&mut resumed, &c, 5, 10);
    for (x, y) in c.iter().zip(&d) {
        let (x, y) = (x.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
        assert!(x.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits()));
    }
    assert_eq!(full.state_dict().unwrap(), resumed.state_dict().unwrap());
    // A state dict from another optimizer kind, or another layout, is refused.
    let mut sgd = Sgd::new(
        vec![ParamGroup::new(named(&c.iter().collect::<Vec<_>>(), "p"))],
        SgdOptions::default(),
    )
    .unwrap();
    let err = sgd
        .load_state_dict(&resumed.state_dict().unwrap())
        .unwrap_err();
    assert!(err
        .to_string()
        .contains("from AdamW but this optimizer is SGD"));
    let mut small = AdamW::new(vec![ParamGroup::new(named(&[&c[0]], "p"))], opts).unwrap();
    assert!(small
        .load_state_dict(&resumed.state_dict().unwrap())
        .is_err());
}

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
fn grad_scaler_unscales_skips_nonfinite_steps_and_adapts_the_scale() {
    let p = param(&[1.0, 2.0]);
    let mut opt = Sgd::new(
        vec![ParamGroup::new(named(&[&p], "w"))],
        SgdOptions::default().lr(1.0),
    )
    .unwrap();
    let mut scaler = GradScaler::new(GradScalerOptions {
        init_scale: 8.0,
        growth_interval: 2,
        ..Default::default()
    })
    .unwrap();
    let loss = Tensor::from_vec(vec![0.5f32], &[1], Device::Cpu).unwrap();
    assert_eq!(
        scaler.scale(&loss).unwrap().to_vec::<f32>().unwrap(),
        vec![4.0]
    );
    grad(&p, &[8.0, 16.0]);
    scaler.unscale_(&mut opt).unwrap();
    assert_eq!(p.grad().unwrap().to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
    assert!(scaler
        .unscale_(&mut opt)
        .unwrap_err()
        .to_string()
        .contains("already been called"));
    assert!(scaler.step(&mut opt).unwrap());
    assert_eq!(p.to_vec::<f32>().unwrap(), vec![0.0, 0.0]);
    scaler.update().unwrap();
    assert_eq!((scaler.get_scale(), scaler.growth_tracker()), (8.0, 1));
    grad(&p, &[8.0, 8.0]);
    assert!(scaler.step(&mut opt).unwrap()); // unscales itself
    scaler.update().unwrap();
    assert_eq!((scaler.get_scale(), scaler.growth_tracker()), (16.0, 0));
    grad(&p, &[f32::INFINITY, 1.0]);
    assert!(!scaler.step(&mut opt).unwrap());
    assert_eq!(
        p.to_vec::<f32>().unwrap(),
        vec![-1.0, -1.0],
        "the step was skipped"
    );
    scaler.update().unwrap();
    assert_eq!(scaler.get_scale(), 8.0);
    let saved = scaler.state_dict();
    let mut other = GradScaler::default();
    other.load_state_dict(&saved).unwrap();
    assert_eq!(other.state_dict(), saved);
    assert!(GradScaler::new(GradScalerOptions {
        growth_factor: 0.5,
        ..Default::default()
    })
    .is_err());
}

#[test]
fn unsupported_parameters_get_a_message_with_the_fix() {
    let h = Parameter::new(Tensor::zeros(&[2], DType::F16, Device::Cpu).unwrap()).unwrap();
    h.set_grad(Some(Tensor::zeros(&[2], DType::F16, Device::Cpu).unwrap()))
        .unwrap();
    let mut opt = Sgd::new(
        vec![ParamGroup::new(vec![("half.weight".into(), h)])],
        SgdOptions::default(),
    )
    .unwrap();
    let msg = opt.step().unwrap_err().to_string();
    assert!(
        msg.contains("`half.weight`") && msg.contains("master weights in f32"),
        "{msg}"
    );

    // A gradient that views another parameter's buffer would be read while that buffer is
    // written; it is refused instead.
    let (a, b) = (param(&[1.0, 2.0]), param(&[3.0, 4.0]));
    a.set_grad(Some(b.detach())).unwrap();
    let mut opt = Sgd::new(
        vec![ParamGroup::new(named(&[&a, &b], "p"))],
        SgdOptions::default(),
    )
    .unwrap();
    let msg = opt.step().unwrap_err().to_string();
    assert!(msg.contains("`p.0`") && msg.contains("own buffer"), "{msg}");
}

#[test]
fn a_refused_step_changes_no_state_and_the_run_continues_as_if_it_never_happened() {
    // The second parameter's gradient is refused (f64 for an f32 parameter) after the first
    // parameter's gradient passed its checks: no step count may move, or the next step's bias
    // corrections would be off by one for the parameters checked first.
    let run = |refuse_once: bool| {
        let (a, b) = (param(&[1.0, -2.0]), param(&[0.5]));
        let mut opt = AdamW::new(named(&[&a, &b], "p"), AdamOptions::adamw().lr(0.1)).unwrap();
        grad(&a, &[0.3, -0.1]);
        grad(&b, &[0.2]);
        opt.step().unwrap();
        if refuse_once {
            b.set_grad(Some(
                Tensor::from_vec(vec![0.2f64], &[1], Device::Cpu).unwrap(),
            ))
            .unwrap();
            let msg = opt.step().unwrap_err().to_string();
            assert!(msg.contains("`p.1`") && msg.contains("float64"), "{msg}");
            assert_eq!(opt.state_of(&a).unwrap().step, 1);
            assert_eq!(opt.state_of(&b).unwrap().step, 1);
            grad(&b, &[0.2]);
        }
        opt.step().unwrap();
        let steps = (
            opt.state_of(&a).unwrap().step,
            opt.state_of(&b).unwrap().step,
        );
        (
            a.to_vec::<f32>().unwrap(),
            b.to_vec::<f32>().unwrap(),
            steps,
        )
    };
    let (clean, refused) = (run(false), run(true));
    assert_eq!(clean.2, (2, 2));
    assert_eq!(refused, clean);
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

#[test]
fn adamw_on_a_cuda_device_follows_the_cpu_step_for_step() {
    let Some(dev) = kiln_device::testing::cuda_device_or_skip() else {
        return;
    };
    let init: Vec<Vec<f32>> = [5usize, 70_001]
        .iter()
        .map(|&n| (0..n).map(|i| ((i % 11) as f32 - 5.0) * 0.1).collect())
        .collect();
    let mk = |device: Device| -> Vec<Parameter> {
        init.iter()
            .map(|h| {
                let t = Tensor::from_vec(h.clone(), &[h.len()], Device::Cpu).unwrap();
                Parameter::new(t.to_device(device).unwrap()).unwrap()
            })
            .collect()
    };
    let (cpu, gpu) = (mk(Device::Cpu), mk(dev));
    let opts = AdamOptions::adamw().lr(0.01).amsgrad(true);
    let group =
        |ps: &[Parameter]| vec![ParamGroup::new(named(&ps.iter().collect::<Vec<_>>(), "p"))];
    let (mut oc, mut og) = (
        AdamW::new(group(&cpu), opts).unwrap(),
        AdamW::new(group(&gpu), opts).unwrap(),
    );
    for step in 0..3 {
        for (c, g) in cpu.iter().zip(&gpu) {
            let v: Vec<f32> = (0..c.numel())
                .map(|i| ((i + step) % 7) as f32 * 0.3 - 0.9)
                .collect();
            let t = Tensor::from_vec(v, &[c.numel()], Device::Cpu).unwrap();
            c.set_grad(Some(t.clone())).unwrap();
            g.set_grad(Some(t.to_device(dev).unwrap())).unwrap();
        }
        oc.step().unwrap();
        og.step().unwrap();
    }
    for (c, g) in cpu.iter().zip(&gpu) {
        let (c, g) = (c.to_vec::<f32>().unwrap(), g.to_vec::<f32>().unwrap());
        assert!(c
            .iter()
            .zip(&g)
            .all(|(a, b)| (a - b).abs() <= 1e-6 * (1.0 + a.abs())));
    }
}
