//! [`LastLr`] reads the last lrs of every scheduler kind through one trait object: each of the
//! schedulers, stepped twice over one group starting at 0.1, reports the lr it wrote
//! into the group (and, for those with a short closed form, that value), boxed or not.

use kiln_sched::{
    ChainedScheduler, ConstantLR, CosineAnnealingLR, CosineAnnealingWarmRestarts, CyclicLR,
    CyclicOptions, ExponentialLR, LambdaLR, LastLr, LinearLR, LrGroups, LrScheduler,
    MetricScheduler, MultiStepLR, MultiplicativeLR, OneCycleLR, OneCycleOptions, ParamGroupLr,
    PlateauOptions, PolynomialLR, ReduceLROnPlateau, SequentialLR, StepLR,
};

type Build = fn(&mut LrGroups) -> Box<dyn LrScheduler>;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1e-300)
}

#[test]
fn every_step_driven_scheduler_reports_its_last_lr_through_last_lr() {
    // (name, constructor, lr after two steps when it has a short closed form)
    let cases: Vec<(&str, Build, Option<f64>)> = vec![
        (
            "StepLR",
            |o| Box::new(StepLR::new(o, 1, 0.5).unwrap()),
            Some(0.025),
        ),
        (
            "MultiStepLR",
            |o| Box::new(MultiStepLR::new(o, &[1], 0.5).unwrap()),
            Some(0.05),
        ),
        (
            "ExponentialLR",
            |o| Box::new(ExponentialLR::new(o, 0.5).unwrap()),
            Some(0.025),
        ),
        (
            "ConstantLR",
            |o| Box::new(ConstantLR::new(o, 0.5, 3).unwrap()),
            Some(0.05),
        ),
        (
            "LinearLR",
            |o| Box::new(LinearLR::new(o, 0.5, 1.0, 4).unwrap()),
            Some(0.075),
        ),
        (
            "PolynomialLR",
            |o| Box::new(PolynomialLR::new(o, 4, 1.0).unwrap()),
            Some(0.05),
        ),
        (
            "CosineAnnealingLR",
            |o| Box::new(CosineAnnealingLR::new(o, 2, 0.0).unwrap()),
            Some(0.0),
        ),
        (
            "CosineAnnealingWarmRestarts",
            |o| Box::new(CosineAnnealingWarmRestarts::new(o, 4, 1, 0.0).unwrap()),
            Some(0.05),
        ),
        (
            "CyclicLR",
            |o| {
                let options = CyclicOptions {
                    step_size_up: 4,
                    cycle_momentum: false,
                    ..Default::default()
                };
                Box::new(CyclicLR::new(o, 0.1, 0.5, options).unwrap())
            },
            Some(0.3),
        ),
        (
            "OneCycleLR",
            |o| {
                let options = OneCycleOptions {
                    cycle_momentum: false,
                    ..Default::default()
                };
                Box::new(OneCycleLR::new(o, 1.0, 10, options).unwrap())
            },
            None,
        ),
        (
            "LambdaLR",
            |o| Box::new(LambdaLR::new(o, |e| 1.0 / (1 + e) as f64).unwrap()),
            None,
        ),
        (
            "MultiplicativeLR",
            |o| Box::new(MultiplicativeLR::new(o, |_| 0.5).unwrap()),
            Some(0.025),
        ),
        (
            "SequentialLR",
            |o| {
                let a = ConstantLR::new(o, 0.5, 1).unwrap();
                let b = ExponentialLR::new(o, 0.5).unwrap();
                Box::new(SequentialLR::new(o, vec![Box::new(a), Box::new(b)], &[1]).unwrap())
            },
            Some(0.05),
        ),
        (
            "ChainedScheduler",
            |o| {
                let a = StepLR::new(o, 1, 0.5).unwrap();
                let b = ExponentialLR::new(o, 0.5).unwrap();
                Box::new(ChainedScheduler::new(o, vec![Box::new(a), Box::new(b)]).unwrap())
            },
            Some(0.1 / 16.0),
        ),
    ];
    assert_eq!(cases.len(), 14);
    for (name, build, want) in cases {
        let mut opt = LrGroups::new(&[0.1]);
        let mut s = build(&mut opt);
        assert_eq!(s.name(), name);
        s.step(&mut opt).unwrap();
        s.step(&mut opt).unwrap();
        let written = opt.group_lr(0);
        let as_trait: &dyn LastLr = &s; // Box<dyn LrScheduler>
        assert_eq!(as_trait.last_lr(), &[written], "{name}");
        assert_eq!((*s).last_lr(), &[written], "{name}"); // dyn LrScheduler
        if let Some(want) = want {
            assert!(close(written, want), "{name}: {written}, want {want}");
        }
    }
}

#[test]
fn concrete_and_metric_driven_schedulers_share_the_trait() {
    let (mut a, mut b) = (LrGroups::new(&[0.1, 0.01]), LrGroups::new(&[0.1, 0.01]));
    let mut step = StepLR::new(&mut a, 2, 0.1).unwrap();
    let mut plateau = ReduceLROnPlateau::new(
        &mut b,
        PlateauOptions {
            patience: 0,
            factor: 0.5,
            ..Default::default()
        },
    )
    .unwrap();
    for metric in [1.0, 2.0] {
        step.step(&mut a).unwrap();
        plateau.step(&mut b, metric).unwrap();
    }
    // StepLR(2, 0.1) after two steps; the plateau halved both groups after one bad epoch.
    let step_lr = step.last_lr().to_vec();
    assert!(
        close(step_lr[0], 0.01) && close(step_lr[1], 0.001),
        "{step_lr:?}"
    );
    let boxed: Box<dyn MetricScheduler> = Box::new(plateau);
    let all: Vec<&dyn LastLr> = vec![&step, &boxed];
    let got: Vec<Vec<f64>> = all.iter().map(|s| s.last_lr().to_vec()).collect();
    assert_eq!(got[1], vec![0.05, 0.005]);
    assert_eq!(got[0], step_lr);
    assert_eq!(got[1], vec![b.group_lr(0), b.group_lr(1)]);
}
