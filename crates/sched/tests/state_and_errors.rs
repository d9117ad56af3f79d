//! Resuming from a state dict, typed errors for invalid settings, ReduceLROnPlateau's NaN
//! handling and groups added later, steps an optimizer refuses (undone), and warm restarts at
//! an exact cycle end.

use kiln_sched::{
    ChainedScheduler, ConstantLR, CosineAnnealingLR, CosineAnnealingWarmRestarts, CyclicLR,
    CyclicMode, CyclicOptions, ExponentialLR, LambdaLR, LinearLR, LrGroups, LrScheduler,
    MetricScheduler, MultiStepLR, MultiplicativeLR, OneCycleLR, OneCycleOptions, ParamGroupLr,
    PlateauOptions, PolynomialLR, ReduceLROnPlateau, SchedError, SequentialLR, StepLR,
};

const KINDS: [&str; 14] = [
    "StepLR",
    "MultiStepLR",
    "ExponentialLR",
    "CosineAnnealingLR",
    "CosineAnnealingWarmRestarts",
    "LinearLR",
    "ConstantLR",
    "LambdaLR",
    "MultiplicativeLR",
    "PolynomialLR",
    "OneCycleLR",
    "CyclicLR",
    "SequentialLR",
    "ChainedScheduler",
];

fn make(kind: &str, opt: &mut LrGroups) -> Box<dyn LrScheduler> {
    match kind {
        "StepLR" => Box::new(StepLR::new(opt, 7, 0.5).unwrap()),
        "MultiStepLR" => Box::new(MultiStepLR::new(opt, &[5, 20, 20, 45], 0.3).unwrap()),
        "ExponentialLR" => Box::new(ExponentialLR::new(opt, 0.97).unwrap()),
        "CosineAnnealingLR" => Box::new(CosineAnnealingLR::new(opt, 13, 1e-4).unwrap()),
        "CosineAnnealingWarmRestarts" => {
            Box::new(CosineAnnealingWarmRestarts::new(opt, 4, 2, 1e-4).unwrap())
        }
        "LinearLR" => Box::new(LinearLR::new(opt, 0.2, 1.0, 25).unwrap()),
        "ConstantLR" => Box::new(ConstantLR::new(opt, 0.5, 25).unwrap()),
        "LambdaLR" => Box::new(LambdaLR::new(opt, |e| 1.0 / (1.0 + e as f64)).unwrap()),
        "MultiplicativeLR" => Box::new(MultiplicativeLR::new(opt, |_| 0.98).unwrap()),
        "PolynomialLR" => Box::new(PolynomialLR::new(opt, 40, 2.0).unwrap()),
        "OneCycleLR" => {
            Box::new(OneCycleLR::new(opt, [0.2, 0.1], 60, OneCycleOptions::default()).unwrap())
        }
        "CyclicLR" => {
            let o = CyclicOptions {
                step_size_up: 6,
                mode: CyclicMode::Triangular2,
                ..Default::default()
            };
            Box::new(CyclicLR::new(opt, 0.001, 0.1, o).unwrap())
        }
        "SequentialLR" => {
            let a = Box::new(LinearLR::new(opt, 0.1, 1.0, 10).unwrap());
            let b = Box::new(CosineAnnealingLR::new(opt, 20, 0.0).unwrap());
            let c = Box::new(StepLR::new(opt, 5, 0.5).unwrap());
            Box::new(SequentialLR::new(opt, vec![a, b, c], &[10, 30]).unwrap())
        }
        "ChainedScheduler" => {
            let a = Box::new(ConstantLR::new(opt, 0.5, 8).unwrap());
            let b = Box::new(ExponentialLR::new(opt, 0.95).unwrap());
            Box::new(ChainedScheduler::new(opt, vec![a, b]).unwrap())
        }
        other => panic!("{other}"),
    }
}

fn fresh_opt() -> LrGroups {
    LrGroups::with_momentum(&[0.1, 0.02], 0.9)
}

/// A run interrupted at step k and resumed from JSON text continues bit for bit.
#[test]
fn resumed_run_continues_identically_for_every_scheduler() {
    let (k, total) = (17, 55);
    for kind in KINDS {
        let mut opt = fresh_opt();
        let mut s = make(kind, &mut opt);
        let mut reference = Vec::new();
        let mut saved = None;
        for step in 1..=total {
            s.step(&mut opt).unwrap();
            reference.push((opt.lrs(), opt.group_momentum(0)));
            if step == k {
                let text = serde_json::to_string(&(s.state_dict(), &opt)).unwrap();
                saved = Some(text);
            }
        }
        // Resume: build the same scheduler on a new optimizer, then restore both.
        let (state, saved_opt): (serde_json::Value, LrGroups) =
            serde_json::from_str(&saved.unwrap()).unwrap();
        let mut opt2 = fresh_opt();
        let mut s2 = make(kind, &mut opt2);
        opt2 = saved_opt;
        s2.load_state_dict(&state).unwrap();
        assert_eq!(
            s2.last_epoch(),
            s.last_epoch() - (total - k) as i64,
            "{kind}"
        );
        for (i, want) in reference[k..].iter().enumerate() {
            s2.step(&mut opt2).unwrap();
            assert_eq!(
                &(opt2.lrs(), opt2.group_momentum(0)),
                want,
                "{kind} at step {}",
                k + 1 + i
            );
        }
        assert_eq!(s2.get_last_lr(), s.get_last_lr(), "{kind}");
    }
}

#[test]
fn plateau_resumes_identically_with_infinite_best() {
    let metrics: Vec<f64> = (0..60)
        .map(|t| {
            if t % 9 == 4 {
                f64::NAN
            } else {
                1.0 / (1.0 + (t / 7) as f64)
            }
        })
        .collect();
    let options = PlateauOptions {
        patience: 2,
        cooldown: 1,
        factor: 0.5,
        ..Default::default()
    };
    let mut opt = fresh_opt();
    let mut s = ReduceLROnPlateau::new(&mut opt, options.clone()).unwrap();
    // Before any step `best` is +inf; it must survive JSON.
    let initial = serde_json::to_string(&s.state_dict()).unwrap();
    let mut s0 = ReduceLROnPlateau::new(&mut fresh_opt(), options.clone()).unwrap();
    s0.load_state_dict(&serde_json::from_str(&initial).unwrap())
        .unwrap();
    assert_eq!(s0.best(), f64::INFINITY);

    let mut lrs = Vec::new();
    let mut saved = None;
    for (t, &m) in metrics.iter().enumerate() {
        s.step(&mut opt, m).unwrap();
        lrs.push(opt.lrs());
        if t == 20 {
            saved = Some(serde_json::to_string(&(s.state_dict(), &opt)).unwrap());
        }
    }
    let (state, mut opt2): (serde_json::Value, LrGroups) =
        serde_json::from_str(&saved.unwrap()).unwrap();
    let mut s2 = ReduceLROnPlateau::new(&mut fresh_opt(), options).unwrap();
    s2.load_state_dict(&state).unwrap();
    for (t, &m) in metrics.iter().enumerate().skip(21) {
        s2.step(&mut opt2, m).unwrap();
        assert_eq!(opt2.lrs(), lrs[t], "step {t}");
    }
    assert!(lrs.last().unwrap()[0] < 0.1, "the schedule did reduce");
}

#[test]
fn plateau_counts_nan_as_a_bad_epoch() {
    let mut opt = LrGroups::new(&[1.0]);
    let options = PlateauOptions {
        patience: 2,
        ..Default::default()
    };
    let mut s = ReduceLROnPlateau::new(&mut opt, options).unwrap();
    s.step(&mut opt, 0.5).unwrap();
    assert_eq!(s.best(), 0.5);
    s.step(&mut opt, f64::NAN).unwrap();
    s.step(&mut opt, f64::NAN).unwrap();
    assert_eq!((s.num_bad_epochs(), opt.group_lr(0)), (2, 1.0));
    s.step(&mut opt, f64::NAN).unwrap();
    assert_eq!((s.num_bad_epochs(), opt.group_lr(0)), (0, 0.1));
    assert_eq!(s.best(), 0.5, "NaN never becomes the best");
}

#[test]
fn plateau_respects_per_group_min_lr_and_eps() {
    let mut opt = LrGroups::new(&[1.0, 1.0]);
    let options = PlateauOptions {
        patience: 0,
        factor: 0.5,
        min_lr: vec![0.3, 0.0].into(),
        eps: 0.2,
        ..Default::default()
    };
    let mut s = ReduceLROnPlateau::new(&mut opt, options).unwrap();
    let seen: Vec<Vec<f64>> = (0..5)
        .map(|_| {
            s.step(&mut opt, 1.0).unwrap();
            opt.lrs()
        })
        .collect();
    // Group 0 stops at min_lr 0.3 (0.5 -> 0.3 is a cut of 0.2, not > eps, so it stays 0.5);
    // group 1 halves until a cut would be <= eps.
    assert_eq!(seen[0], vec![1.0, 1.0]); // first step sets best = 1.0
    assert_eq!(seen[1], vec![0.5, 0.5]);
    assert_eq!(seen[2], vec![0.5, 0.25]);
    assert_eq!(seen[3], vec![0.5, 0.25]);
}

fn expect_invalid<T: std::fmt::Debug>(r: Result<T, SchedError>, parameter: &str) -> String {
    match r {
        Err(e @ SchedError::InvalidParameter { parameter: p, .. }) => {
            assert_eq!(p, parameter, "{e}");
            e.to_string()
        }
        other => panic!("expected InvalidParameter({parameter}), got {other:?}"),
    }
}

#[test]
fn invalid_settings_are_typed_errors_naming_the_parameter() {
    let mut opt = LrGroups::new(&[0.1]);
    let msg = expect_invalid(StepLR::new(&mut opt, 10, 0.0), "gamma");
    assert!(msg.contains("StepLR") && msg.contains("> 0"), "{msg}");
    expect_invalid(StepLR::new(&mut opt, 0, 0.1), "step_size");
    expect_invalid(ExponentialLR::new(&mut opt, -0.5), "gamma");
    let msg = expect_invalid(MultiStepLR::new(&mut opt, &[30, 10], 0.1), "milestones");
    assert!(msg.contains("ascending"), "{msg}");
    let msg = expect_invalid(CosineAnnealingLR::new(&mut opt, 0, 0.0), "T_max");
    assert!(msg.contains("at least 1"), "{msg}");
    expect_invalid(CosineAnnealingWarmRestarts::new(&mut opt, 0, 1, 0.0), "T_0");
    expect_invalid(ConstantLR::new(&mut opt, 1.5, 5), "factor");
    expect_invalid(LinearLR::new(&mut opt, 0.0, 1.0, 5), "start_factor");
    expect_invalid(LinearLR::new(&mut opt, 0.5, 1.0, 0), "total_iters");
    expect_invalid(PolynomialLR::new(&mut opt, 0, 1.0), "total_iters");
    expect_invalid(
        OneCycleLR::new(&mut opt, 0.1, 0, OneCycleOptions::default()),
        "total_steps",
    );
    let o = OneCycleOptions {
        pct_start: 1.5,
        cycle_momentum: false,
        ..Default::default()
    };
    expect_invalid(OneCycleLR::new(&mut opt, 0.1, 100, o), "pct_start");
    // 10% of 10 steps ends the warm-up at step 0: a phase zero steps long (0/0 in PyTorch).
    let o = OneCycleOptions {
        pct_start: 0.1,
        cycle_momentum: false,
        ..Default::default()
    };
    let msg = expect_invalid(OneCycleLR::new(&mut opt, 0.1, 10, o), "pct_start");
    assert!(msg.contains("zero steps long"), "{msg}");
    let o = PlateauOptions {
        factor: 1.0,
        ..Default::default()
    };
    expect_invalid(ReduceLROnPlateau::new(&mut opt, o), "factor");
    let o = CyclicOptions {
        step_size_up: 0,
        cycle_momentum: false,
        ..Default::default()
    };
    expect_invalid(CyclicLR::new(&mut opt, 0.01, 0.1, o), "step_size_up");
    let s = Box::new(StepLR::new(&mut opt, 3, 0.5).unwrap());
    expect_invalid(SequentialLR::new(&mut opt, vec![s], &[5]), "milestones");
}

#[test]
fn onecycle_past_total_steps_errors_and_changes_nothing() {
    let mut opt = LrGroups::with_momentum(&[0.1], 0.9);
    let mut s = OneCycleLR::new(&mut opt, 0.5, 10, OneCycleOptions::default()).unwrap();
    for _ in 0..10 {
        s.step(&mut opt).unwrap();
    }
    let before = (opt.clone(), s.state_dict());
    match s.step(&mut opt) {
        Err(SchedError::StepsExhausted {
            step: 11,
            total_steps: 10,
        }) => {}
        other => panic!("expected StepsExhausted, got {other:?}"),
    }
    assert_eq!((opt, s.state_dict()), before);
}

#[test]
fn group_and_momentum_mismatches_are_errors() {
    let mut opt = LrGroups::new(&[0.1, 0.2]);
    match OneCycleLR::new(
        &mut opt,
        vec![0.1, 0.2, 0.3],
        100,
        OneCycleOptions::default(),
    ) {
        Err(SchedError::GroupCountMismatch {
            parameter: "max_lr",
            expected: 2,
            got: 3,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    // cycle_momentum on an optimizer without momentum.
    match OneCycleLR::new(&mut opt, 0.1, 100, OneCycleOptions::default()) {
        Err(e @ SchedError::NoMomentum { .. }) => assert!(e.to_string().contains("cycle_momentum")),
        other => panic!("{other:?}"),
    }
    // A scheduler stepped with an optimizer that has a different number of groups.
    let mut s = StepLR::new(&mut opt, 2, 0.5).unwrap();
    let mut other = LrGroups::new(&[0.1]);
    assert!(matches!(
        s.step(&mut other),
        Err(SchedError::GroupCountMismatch { .. })
    ));
    // Loading another scheduler's state.
    let e = ExponentialLR::new(&mut LrGroups::new(&[0.1, 0.2]), 0.9).unwrap();
    match s.load_state_dict(&e.state_dict()) {
        Err(err @ SchedError::State { .. }) => assert!(err.to_string().contains("ExponentialLR")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn momentum_cycling_writes_the_optimizer() {
    let mut opt = LrGroups::with_momentum(&[0.1], 0.0);
    let mut s = OneCycleLR::new(&mut opt, 1.0, 100, OneCycleOptions::default()).unwrap();
    assert_eq!(opt.group_momentum(0), Some(0.95), "starts at max_momentum");
    // PyTorch's cos anneal at pct 0 is `end + (start - end) / 2 * 2`, a few ulps off `start`.
    assert!(
        (opt.group_lr(0) - 1.0 / 25.0).abs() < 1e-15,
        "starts at max_lr / div_factor"
    );
    assert_eq!(opt.group_initial_lr(0), Some(1.0 / 25.0));
    for _ in 0..29 {
        s.step(&mut opt).unwrap();
    }
    // step 29 = end of the warm-up phase: lr at max, momentum at base.
    assert!(
        (opt.group_lr(0) - 1.0).abs() < 1e-15
            && (opt.group_momentum(0).unwrap() - 0.85).abs() < 1e-15
    );
}

/// An optimizer that refuses learning rates below `floor` (as kiln's refuse negative ones).
struct Floor {
    groups: LrGroups,
    floor: f64,
}

impl ParamGroupLr for Floor {
    fn num_lr_groups(&self) -> usize {
        self.groups.num_lr_groups()
    }
    fn group_lr(&self, group: usize) -> f64 {
        self.groups.group_lr(group)
    }
    fn set_group_lr(&mut self, group: usize, lr: f64) -> Result<(), SchedError> {
        if lr < self.floor {
            return Err(SchedError::Refused {
                group,
                what: "lr",
                value: lr,
                reason: format!("below {}", self.floor),
            });
        }
        self.groups.set_group_lr(group, lr)
    }
    fn group_initial_lr(&self, group: usize) -> Option<f64> {
        self.groups.group_initial_lr(group)
    }
    fn set_group_initial_lr(&mut self, group: usize, lr: f64) -> Result<(), SchedError> {
        self.groups.set_group_initial_lr(group, lr)
    }
}

/// A single `min_lr` also covers a group added after the scheduler was built (PyTorch keeps
/// `default_min_lr` for this); a cut the optimizer refuses leaves scheduler and optimizer as
/// they were.
#[test]
fn plateau_covers_later_groups_and_undoes_a_refused_cut() {
    let mut opt = LrGroups::new(&[1.0]);
    let options = PlateauOptions {
        patience: 0,
        factor: 0.5,
        min_lr: 0.3.into(),
        ..Default::default()
    };
    let mut s = ReduceLROnPlateau::new(&mut opt, options.clone()).unwrap();
    s.step(&mut opt, 1.0).unwrap();
    opt.groups.push(opt.groups[0].clone());
    s.step(&mut opt, 1.0).unwrap();
    assert_eq!(opt.lrs(), vec![0.5, 0.5]);
    s.step(&mut opt, 1.0).unwrap();
    assert_eq!(
        opt.lrs(),
        vec![0.3, 0.3],
        "the added group is cut and held at min_lr too"
    );

    let mut opt = Floor {
        groups: LrGroups::new(&[1.0, 1.0]),
        floor: 0.4,
    };
    let options = PlateauOptions {
        min_lr: 0.0.into(),
        ..options
    };
    let mut s = ReduceLROnPlateau::new(&mut opt, options).unwrap();
    s.step(&mut opt, 1.0).unwrap();
    s.step(&mut opt, 1.0).unwrap();
    let before = s.state_dict();
    let e = s.step(&mut opt, 1.0).unwrap_err();
    assert!(matches!(e, SchedError::Refused { group: 0, .. }), "{e}");
    assert_eq!(s.state_dict(), before, "the refused step is undone");
    assert_eq!(opt.groups.lrs(), vec![0.5, 0.5]);
}

/// `step_to` an epoch that ends a cycle exactly restarts it (lr back at the base), with and
/// without growing cycles; an epoch whose lr the optimizer refuses changes nothing.
#[test]
fn warm_restarts_step_to_a_cycle_end_restarts_and_a_refusal_changes_nothing() {
    for (t_mult, epoch, next_len) in [(1, 10.0, 10.0), (2, 30.0, 40.0)] {
        let mut opt = LrGroups::new(&[0.1]);
        let mut s = CosineAnnealingWarmRestarts::new(&mut opt, 10, t_mult, 0.0).unwrap();
        s.step_to(&mut opt, epoch).unwrap();
        assert_eq!(opt.lrs(), vec![0.1], "T_mult {t_mult}");
        // A quarter into the new cycle: lr = 0.1 * (1 + cos(pi / 4)) / 2.
        s.step_to(&mut opt, epoch + next_len / 4.0).unwrap();
        let want = 0.05 * (1.0 + std::f64::consts::FRAC_PI_4.cos());
        assert!((opt.lrs()[0] - want).abs() < 1e-15, "T_mult {t_mult}");
    }
    let mut opt = Floor {
        groups: LrGroups::new(&[0.1]),
        floor: 0.05,
    };
    let mut s = CosineAnnealingWarmRestarts::new(&mut opt, 10, 1, 0.0).unwrap();
    s.step_to(&mut opt, 2.0).unwrap();
    let before = (s.state_dict(), opt.groups.lrs());
    let e = s.step_to(&mut opt, 8.0).unwrap_err();
    assert!(matches!(e, SchedError::Refused { .. }), "{e}");
    assert_eq!((s.state_dict(), opt.groups.lrs()), before);
}
