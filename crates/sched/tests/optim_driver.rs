//! Schedulers driving a real kiln-optim AdamW with two parameter groups write exactly the lrs
//! they write into `LrGroups`, and the optimizer keeps `initial_lr` in its state dict.

use kiln_autograd::{DType, Device, Parameter, Tensor};
use kiln_optim::{Adam, AdamOptions, AdamW, Optimizer, ParamGroup, StateDict};
use kiln_sched::{
    CosineAnnealingLR, LinearLR, LrGroups, LrScheduler, ParamGroupLr, SequentialLR, StepLR,
};

fn param(n: usize, fill: f32) -> Parameter {
    Parameter::new(Tensor::from_vec(vec![fill; n], &[n], Device::Cpu).unwrap()).unwrap()
}

/// AdamW over a 3-element "backbone" at lr 1e-3 and a 2-element "head" at lr 1e-2.
fn adamw() -> Adam {
    AdamW::new(
        vec![
            ParamGroup::new(vec![("backbone.w".into(), param(3, 0.5))]).lr(1e-3),
            ParamGroup::new(vec![("head.w".into(), param(2, -0.5))]).lr(1e-2),
        ],
        AdamOptions::adamw().weight_decay(0.05),
    )
    .unwrap()
}

/// One real optimizer step with a constant gradient, so the lrs are used, not only stored.
fn train_step(opt: &mut Adam) {
    for (_, p) in opt.named_params() {
        let g = Tensor::ones(p.shape(), DType::F32, Device::Cpu).unwrap();
        p.set_grad(Some(g)).unwrap();
    }
    opt.step().unwrap();
    opt.zero_grad(true).unwrap();
}

fn lrs(opt: &dyn ParamGroupLr) -> Vec<f64> {
    (0..opt.num_lr_groups()).map(|g| opt.group_lr(g)).collect()
}

/// Runs `make`'s scheduler for `steps` steps on AdamW and on `LrGroups` with the same lrs and
/// returns both lr sequences (each step's lrs, bit patterns).
fn both<S: LrScheduler>(
    steps: usize,
    make: impl Fn(&mut dyn ParamGroupLr) -> S,
) -> (Vec<Vec<u64>>, Vec<Vec<u64>>) {
    let bits = |v: Vec<f64>| v.into_iter().map(f64::to_bits).collect::<Vec<_>>();
    let mut opt = adamw();
    let mut groups = LrGroups::new(&[1e-3, 1e-2]);
    let mut s_opt = make(&mut opt);
    let mut s_groups = make(&mut groups);
    let (mut a, mut b) = (vec![bits(lrs(&opt))], vec![bits(groups.lrs())]);
    for _ in 0..steps {
        train_step(&mut opt);
        s_opt.step(&mut opt).unwrap();
        s_groups.step(&mut groups).unwrap();
        assert_eq!(s_opt.get_last_lr(), s_groups.get_last_lr());
        a.push(bits(lrs(&opt)));
        b.push(bits(groups.lrs()));
    }
    (a, b)
}

#[test]
fn step_lr_on_adamw_matches_lr_groups() {
    let (on_opt, on_groups) = both(25, |o| StepLR::new(o, 7, 0.3).unwrap());
    assert_eq!(on_opt, on_groups);
    // The sequence really moved: 1e-3 * 0.3^3 after 21..27 steps.
    let last = f64::from_bits(on_opt[25][0]);
    assert!((last - 1e-3 * 0.027).abs() < 1e-15, "{last}");
}

#[test]
fn warmup_then_cosine_on_adamw_matches_lr_groups() {
    let make = |o: &mut dyn ParamGroupLr| {
        let warmup = LinearLR::new(o, 0.1, 1.0, 5).unwrap();
        let cosine = CosineAnnealingLR::new(o, 20, 1e-5).unwrap();
        SequentialLR::new(o, vec![Box::new(warmup), Box::new(cosine)], &[5]).unwrap()
    };
    let (on_opt, on_groups) = both(30, make);
    assert_eq!(on_opt, on_groups);
    // Warm-up starts at a tenth of the base lr and the head peaks at its base lr.
    assert_eq!(f64::from_bits(on_opt[0][1]), 1e-2 * 0.1);
    assert_eq!(f64::from_bits(on_opt[5][1]), 1e-2);
}

#[test]
fn initial_lr_is_recorded_once_and_saved_in_the_state_dict() {
    let mut opt = adamw();
    assert_eq!(Optimizer::initial_lr(&opt, 0).unwrap(), None);
    let mut s = StepLR::new(&mut opt, 1, 0.5).unwrap();
    s.step(&mut opt).unwrap();
    // A second scheduler attached later keeps the first one's initial_lr.
    let _second = StepLR::new(&mut opt, 1, 0.5).unwrap();
    assert_eq!(Optimizer::initial_lr(&opt, 0).unwrap(), Some(1e-3));
    assert_eq!(Optimizer::initial_lr(&opt, 1).unwrap(), Some(1e-2));
    assert_eq!(opt.lr(1).unwrap(), 5e-3);

    let sd = opt.state_dict().unwrap();
    assert_eq!(sd.groups[1].initial_lr, Some(1e-2));
    let text = serde_json::to_string(&sd).unwrap();
    let mut fresh = adamw();
    fresh
        .load_state_dict(&serde_json::from_str(&text).unwrap())
        .unwrap();
    assert_eq!(Optimizer::initial_lr(&fresh, 1).unwrap(), Some(1e-2));
    assert_eq!(Optimizer::lr(&fresh, 1).unwrap(), 5e-3);

    // A state dict written before initial_lr was kept loads as "no scheduler attached yet".
    let mut old: serde_json::Value = serde_json::from_str(&text).unwrap();
    for g in old["groups"].as_array_mut().unwrap() {
        g.as_object_mut().unwrap().remove("initial_lr");
    }
    let old: StateDict = serde_json::from_value(old).unwrap();
    fresh.load_state_dict(&old).unwrap();
    assert_eq!(Optimizer::initial_lr(&fresh, 0).unwrap(), None);

    // Out-of-range groups and invalid lrs are errors through the Optimizer API.
    assert!(Optimizer::initial_lr(&fresh, 2).is_err());
    assert!(Optimizer::set_initial_lr(&mut fresh, 0, f64::NAN).is_err());
}
