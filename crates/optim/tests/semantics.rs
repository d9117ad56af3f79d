//! Behaviour tests: parameter groups, frozen parameters, state dicts, the grad-scale hand-off and
//! GradScaler (clipping's are in `clip.rs`).

use kiln_autograd::{no_grad, DType, Device, Parameter, Tensor};
use kiln_optim::{
    Adam, AdamOptions, AdamW, GradScaler, GradScalerOptions, Optimizer, ParamGroup, Sgd,
    SgdOptions, StateDict,
};

mod common;
use common::{grad, named, param};

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

/// The GradScaler tests' subject: a parameter `[1, 2]` and plain SGD with lr 1 over it, so a
/// taken step subtracts the unscaled gradient exactly.
fn scaled_sgd() -> (Parameter, Sgd) {
    let p = param(&[1.0, 2.0]);
    let opt = Sgd::new(
        vec![ParamGroup::new(named(&[&p], "w"))],
        SgdOptions::default().lr(1.0),
    )
    .unwrap();
    (p, opt)
}

#[test]
fn grad_scaler_unscales_skips_nonfinite_steps_and_adapts_the_scale() {
    let (p, mut opt) = scaled_sgd();
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
fn grad_scaler_catches_an_unscale_overflow_and_refuses_a_step_without_gradients() {
    let (p, mut opt) = scaled_sgd();
    let mut scaler = GradScaler::new(GradScalerOptions {
        init_scale: 0.25,
        ..Default::default()
    })
    .unwrap();
    // 2e38 is finite, 2e38 / 0.25 is not: PyTorch checks the gradient before unscaling and
    // steps with an infinite one; kiln checks what the step would use and skips it.
    grad(&p, &[2e38, 1.0]);
    assert!(!scaler.step(&mut opt).unwrap());
    assert_eq!(
        p.grad().unwrap().to_vec::<f32>().unwrap(),
        vec![f32::INFINITY, 4.0]
    );
    assert_eq!(
        p.to_vec::<f32>().unwrap(),
        vec![1.0, 2.0],
        "the step was skipped"
    );
    scaler.update().unwrap();
    assert_eq!(scaler.get_scale(), 0.125);
    // No gradient at all: nothing to check or step (PyTorch raises here too), the scale and
    // the growth tracker stay, and the next step with gradients goes on normally.
    p.set_grad(None).unwrap();
    scaler.unscale_(&mut opt).unwrap();
    let e = scaler.step(&mut opt).unwrap_err().to_string();
    assert!(
        e.contains("no parameter of this optimizer has a gradient") && e.contains("backward"),
        "{e}"
    );
    let e = scaler.update().unwrap_err().to_string();
    assert!(e.contains("no inf checks were recorded"), "{e}");
    assert_eq!((scaler.get_scale(), scaler.growth_tracker()), (0.125, 0));
    grad(&p, &[0.125, 0.25]);
    assert!(scaler.step(&mut opt).unwrap());
    assert_eq!(p.to_vec::<f32>().unwrap(), vec![0.0, 0.0]);
    scaler.update().unwrap();
    assert_eq!(scaler.growth_tracker(), 1);
    // set_scale takes what init_scale takes: 1e39 is inf as f32, 1e-46 is 0.
    for bad in [1e39, 1e-46, 0.0, f64::NAN] {
        let e = scaler.set_scale(bad).unwrap_err().to_string();
        assert!(e.contains("must be positive and within f32's range"), "{e}");
    }
    assert_eq!(scaler.get_scale(), 0.125);
}

#[test]
fn grad_scaler_refuses_to_back_its_scale_off_below_a_usable_one() {
    let (p, mut opt) = scaled_sgd();
    let mut scaler = GradScaler::new(GradScalerOptions::default()).unwrap();
    // NaN gradients at every scale: 2^16 halves down to 2^-127 in 143 updates; the 144th is
    // refused and keeps the scale, since at 2^-128 the unscale's 1 / scale is inf in f32 and
    // every later step would be skipped (PyTorch's scale goes on down to 0 without a word).
    let mut updates = 0;
    let e = loop {
        grad(&p, &[f32::NAN, 1.0]);
        assert!(!scaler.step(&mut opt).unwrap());
        match scaler.update() {
            Ok(()) => updates += 1,
            Err(e) => break e.to_string(),
        }
        assert!(updates <= 143, "the scale reached {}", scaler.get_scale());
    };
    assert_eq!(updates, 143);
    assert_eq!(scaler.get_scale(), 2f64.powi(-127));
    assert!(
        e.contains("would back off out of f32's usable range") && e.contains("look for a NaN"),
        "{e}"
    );
    assert_eq!(p.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
    // The record was consumed: finite gradients then step and count as usual.
    grad(&p, &[0.0, 0.0]);
    assert!(scaler.step(&mut opt).unwrap());
    scaler.update().unwrap();
    assert_eq!(
        (scaler.get_scale(), scaler.growth_tracker()),
        (2f64.powi(-127), 1)
    );
    // The same floor for the options and set_scale: 2^-128 refused, 2^-127 taken.
    assert!(scaler.set_scale(2f64.powi(-128)).is_err());
    scaler.set_scale(2f64.powi(-127)).unwrap();
    let tiny = GradScalerOptions {
        init_scale: 2f64.powi(-128),
        ..Default::default()
    };
    assert!(GradScaler::new(tiny).is_err());
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

/// PyTorch's `exp_avg.lerp_(grad, 1 - beta1)` computes `grad - (grad - m) * beta1` for weights
/// of 0.5 or more, so with beta1 = 0 the first moment is the gradient bit for bit, whatever came
/// before. The one form `m + w * (grad - m)` rounded `-0.884 + (1.02e-4 + 0.884)` to 1.0198e-4
/// in f32 (0.02 % off), and the step with it.
fn beta1_zero_keeps_the_gradient_as_the_first_moment_on(device: Device) {
    let steps = [[0.8843f32, -1.7], [1.02005e-4, 3.1e-5], [-2.5e-6, 1.5]];
    for decoupled in [false, true] {
        let p = Tensor::from_vec(vec![1.0f32, -2.0], &[2], Device::Cpu).unwrap();
        let p = Parameter::new(p.to_device(device).unwrap()).unwrap();
        let o = AdamOptions::default().betas((0.0, 0.9)).weight_decay(0.0);
        let groups = vec![ParamGroup::new(vec![("p".into(), p.clone())])];
        let mut opt: Box<dyn Optimizer> = if decoupled {
            Box::new(AdamW::new(groups, o).unwrap())
        } else {
            Box::new(Adam::new(groups, o).unwrap())
        };
        for g in steps {
            let t = Tensor::from_vec(g.to_vec(), &[2], Device::Cpu).unwrap();
            p.set_grad(Some(t.to_device(device).unwrap())).unwrap();
            opt.step().unwrap();
            let state = opt.state_dict().unwrap();
            let m = &state.state[0].as_ref().unwrap().buffers["exp_avg"].data;
            let want: Vec<f64> = g.iter().map(|&x| f64::from(x)).collect();
            assert_eq!(m, &want, "{device:?}");
        }
    }
}

#[test]
fn adam_with_beta1_zero_keeps_the_gradient_as_its_first_moment() {
    beta1_zero_keeps_the_gradient_as_the_first_moment_on(Device::Cpu);
}

#[test]
fn adam_with_beta1_zero_keeps_the_gradient_as_its_first_moment_on_cuda() {
    if let Some(cuda) = kiln_device::testing::cuda_device_or_skip() {
        beta1_zero_keeps_the_gradient_as_the_first_moment_on(cuda);
    }
}
