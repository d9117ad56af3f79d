//! Parameter groups, option by option: a group that overrides an option steps exactly as an
//! optimizer whose default is that value, next to a group that keeps the defaults; `zero_grad`
//! reaches every group; a state dict of groups with different options restores each group's
//! own options and initial lr, and one whose state list does not match its groups is refused.

use kiln_autograd::{Device, Parameter, Tensor};
use kiln_optim::{
    Adam, AdamOptions, AdamW, Optimizer, ParamGroup, Result, Sgd, SgdOptions, StateDict,
};

fn param(seed: f32, n: usize) -> Parameter {
    let v = (0..n)
        .map(|i| ((i as f32 + 1.0) * 0.61 + seed).cos())
        .collect();
    Parameter::new(Tensor::from_vec(v, &[n], Device::Cpu).unwrap()).unwrap()
}

/// Two parameters per group: the overridden group's and the plain group's.
fn params() -> [Parameter; 4] {
    [param(0.1, 5), param(0.7, 3), param(1.3, 4), param(2.9, 6)]
}

fn group(ps: &[Parameter], prefix: &str) -> ParamGroup {
    let named = ps
        .iter()
        .enumerate()
        .map(|(i, p)| (format!("{prefix}.{i}"), p.clone()))
        .collect();
    ParamGroup::new(named)
}

/// Four steps with the same gradients for the same parameter index: large at the first step,
/// tiny after (so Adam's second moment shrinks and amsgrad's running maximum matters), signs
/// changing (so momentum, dampening and Nesterov matter).
fn run(opt: &mut dyn Optimizer, ps: &[Parameter], first: usize) {
    for step in 0..4 {
        for (i, p) in ps.iter().enumerate() {
            let scale = if step == 0 { 3.0 } else { 1e-3 };
            let g = (0..p.numel())
                .map(|k| scale * ((k + 3 * (i + first) + 7 * step) as f32).sin())
                .collect();
            p.set_grad(Some(
                Tensor::from_vec(g, &[p.numel()], Device::Cpu).unwrap(),
            ))
            .unwrap();
        }
        opt.step().unwrap();
    }
}

fn bits(ps: &[Parameter]) -> Vec<Vec<u32>> {
    ps.iter()
        .map(|p| {
            p.to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect()
        })
        .collect()
}

/// Steps `[overridden group, plain group]` in one optimizer built with `base` defaults, and
/// each group alone in an optimizer whose defaults are that group's options (`overridden` for
/// the first), and compares bit for bit; checks too that the override changed the result.
fn check<O: Optimizer, D: Copy>(
    case: &str,
    make: impl Fn(Vec<ParamGroup>, D) -> Result<O>,
    base: D,
    overridden: D,
    override_: impl Fn(ParamGroup) -> ParamGroup,
) {
    let ps = params();
    let groups = vec![override_(group(&ps[..2], "a")), group(&ps[2..], "b")];
    run(&mut make(groups, base).unwrap(), &ps, 0);
    let refs = params();
    run(
        &mut make(vec![group(&refs[..2], "a")], overridden).unwrap(),
        &refs[..2],
        0,
    );
    run(
        &mut make(vec![group(&refs[2..], "b")], base).unwrap(),
        &refs[2..],
        2,
    );
    assert_eq!(
        bits(&ps[..2]),
        bits(&refs[..2]),
        "{case}: the overriding group"
    );
    assert_eq!(
        bits(&ps[2..]),
        bits(&refs[2..]),
        "{case}: the group on the defaults"
    );
    // The override made a difference: the defaults alone give other values.
    let other = params();
    run(
        &mut make(vec![group(&other[..2], "a")], base).unwrap(),
        &other[..2],
        0,
    );
    assert_ne!(
        bits(&ps[..2]),
        bits(&other[..2]),
        "{case}: the override changed nothing"
    );
}

#[test]
fn every_sgd_option_a_group_overrides_drives_that_groups_step() {
    let base = SgdOptions::default().lr(0.05).momentum(0.9).dampening(0.0);
    type Case = (&'static str, fn(ParamGroup) -> ParamGroup, SgdOptions);
    let cases: [Case; 6] = [
        ("lr", |g| g.lr(0.2), base.lr(0.2)),
        ("momentum", |g| g.momentum(0.3), base.momentum(0.3)),
        ("dampening", |g| g.dampening(0.4), base.dampening(0.4)),
        ("nesterov", |g| g.nesterov(true), base.nesterov(true)),
        (
            "weight_decay",
            |g| g.weight_decay(0.5),
            base.weight_decay(0.5),
        ),
        ("maximize", |g| g.maximize(true), base.maximize(true)),
    ];
    for (case, over, overridden) in cases {
        check(case, Sgd::new, base, overridden, over);
    }
}

#[test]
fn every_adam_option_a_group_overrides_drives_that_groups_step() {
    type Case = (&'static str, fn(ParamGroup) -> ParamGroup, AdamOptions);
    type Make = fn(Vec<ParamGroup>, AdamOptions) -> Result<Adam>;
    let adams: [(&str, Make, AdamOptions); 2] = [
        ("Adam", Adam::new, AdamOptions::default().lr(0.05)),
        ("AdamW", AdamW::new, AdamOptions::adamw().lr(0.05)),
    ];
    for (kind, make, base) in adams {
        let cases: [Case; 6] = [
            ("lr", |g| g.lr(0.2), base.lr(0.2)),
            ("betas", |g| g.betas((0.5, 0.75)), base.betas((0.5, 0.75))),
            ("eps", |g| g.eps(0.25), base.eps(0.25)),
            (
                "weight_decay",
                |g| g.weight_decay(0.5),
                base.weight_decay(0.5),
            ),
            ("amsgrad", |g| g.amsgrad(true), base.amsgrad(true)),
            ("maximize", |g| g.maximize(true), base.maximize(true)),
        ];
        for (case, over, overridden) in cases {
            check(&format!("{kind} {case}"), make, base, overridden, over);
        }
    }
}

#[test]
fn zero_grad_reaches_every_group() {
    let ps = params();
    let groups = vec![
        group(&ps[..1], "a"),
        group(&ps[1..3], "b"),
        group(&ps[3..], "c"),
    ];
    let mut opt = Sgd::new(groups, SgdOptions::default()).unwrap();
    run(&mut opt, &ps, 0);
    opt.zero_grad(false).unwrap();
    for p in &ps {
        let g = p
            .grad()
            .expect("zero_grad(false) keeps the gradient tensor");
        assert!(g.to_vec::<f32>().unwrap().iter().all(|&x| x == 0.0));
    }
    opt.zero_grad(true).unwrap();
    assert!(ps.iter().all(|p| p.grad().is_none()));
}

fn two_groups(ps: &[Parameter], overrides: bool) -> Sgd {
    let (a, b) = (group(&ps[..2], "a"), group(&ps[2..], "b"));
    let groups = if overrides {
        vec![
            a.lr(0.1).momentum(0.9),
            b.lr(0.01).momentum(0.5).weight_decay(0.2),
        ]
    } else {
        vec![a, b]
    };
    Sgd::new(groups, SgdOptions::default()).unwrap()
}

#[test]
fn a_state_dict_of_several_groups_restores_each_groups_options_and_initial_lr() {
    // Reference: eight uninterrupted steps.
    let full_ps = params();
    let mut full = two_groups(&full_ps, true);
    run(&mut full, &full_ps, 0);
    run(&mut full, &full_ps, 0);
    // Four steps, a state dict through JSON, four more in an optimizer built without overrides.
    let ps = params();
    let mut first = two_groups(&ps, true);
    first.set_initial_lr(0, 0.1).unwrap();
    first.set_initial_lr(1, 0.01).unwrap();
    run(&mut first, &ps, 0);
    let saved: StateDict =
        serde_json::from_str(&serde_json::to_string(&first.state_dict().unwrap()).unwrap())
            .unwrap();
    let mut resumed = two_groups(&ps, false);
    resumed.load_state_dict(&saved).unwrap();
    assert_eq!(resumed.options(0).unwrap(), first.options(0).unwrap());
    assert_eq!(resumed.options(1).unwrap(), first.options(1).unwrap());
    assert_eq!(resumed.options(1).unwrap().weight_decay, 0.2);
    assert_eq!(resumed.initial_lr(0).unwrap(), Some(0.1));
    assert_eq!(resumed.initial_lr(1).unwrap(), Some(0.01));
    run(&mut resumed, &ps, 0);
    assert_eq!(bits(&ps), bits(&full_ps));
}

#[test]
fn a_state_dict_whose_state_list_does_not_match_its_groups_is_refused() {
    let ps = params();
    let mut opt = two_groups(&ps, true);
    run(&mut opt, &ps, 0);
    let good = opt.state_dict().unwrap();
    for (what, bad) in [
        ("one state entry short", {
            let mut sd = good.clone();
            sd.state.pop();
            sd
        }),
        ("one state entry too many", {
            let mut sd = good.clone();
            sd.state.push(None);
            sd
        }),
    ] {
        let mut target = two_groups(&params(), false);
        let before = target.state_dict().unwrap();
        let err = target.load_state_dict(&bad).unwrap_err().to_string();
        assert!(
            err.contains("build the optimizer with the same parameter groups"),
            "{what}: {err}"
        );
        assert_eq!(
            target.state_dict().unwrap(),
            before,
            "{what}: nothing loaded"
        );
    }
}
