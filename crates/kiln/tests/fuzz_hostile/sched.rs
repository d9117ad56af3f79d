//! Scheduler state dicts: a valid state from a few steps of each scheduler, mutated (numbers
//! replaced by hostile values, lists cut or grown, types swapped), loaded into a fresh scheduler
//! of the same kind on `LrGroups` or a real AdamW, then stepped. Loading may refuse; nothing may
//! panic, and a refused load must leave the scheduler as it was.

use crate::harness::{assert_readable, refused, run, Outcome, Rng};
use crate::json_mutation::mutate;
use kiln::autograd::{Device, Parameter, Tensor};
use kiln::optim::{AdamOptions, AdamW, ParamGroup};
use kiln::sched::{
    Anneal, ChainedScheduler, ConstantLR, CosineAnnealingLR, CosineAnnealingWarmRestarts, CyclicLR,
    CyclicMode, CyclicOptions, ExponentialLR, LambdaLR, LinearLR, LrGroups, LrScheduler,
    MetricScheduler, MultiStepLR, MultiplicativeLR, OneCycleLR, OneCycleOptions, ParamGroupLr,
    PlateauOptions, PolynomialLR, ReduceLROnPlateau, SequentialLR, StepLR,
};
use serde_json::Value;

const KINDS: [&str; 16] = [
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
    "OneCycleLR-linear-3",
    "CyclicLR",
    "SequentialLR",
    "ChainedScheduler",
    "ReduceLROnPlateau",
];

/// A step-driven or metric-driven scheduler behind one interface for the fuzzer.
enum Sched {
    Step(Box<dyn LrScheduler>),
    Metric(ReduceLROnPlateau),
}

impl Sched {
    fn state_dict(&self) -> Value {
        match self {
            Sched::Step(s) => s.state_dict(),
            Sched::Metric(s) => s.state_dict(),
        }
    }
    /// Loads `v`; a refusal's message is checked with [`assert_readable`].
    fn load(&mut self, v: &Value) -> bool {
        let result = match self {
            Sched::Step(s) => s.load_state_dict(v),
            Sched::Metric(s) => s.load_state_dict(v),
        };
        if let Err(e) = &result {
            assert_readable(&e.to_string());
        }
        result.is_ok()
    }
    fn step(&mut self, opt: &mut dyn ParamGroupLr, metric: f64) -> bool {
        match self {
            Sched::Step(s) => s.step(opt).is_ok(),
            Sched::Metric(s) => s.step(opt, metric).is_ok(),
        }
    }
    fn last_lr(&self) -> Vec<f64> {
        match self {
            Sched::Step(s) => s.get_last_lr().to_vec(),
            Sched::Metric(s) => s.get_last_lr().to_vec(),
        }
    }
}

fn make(kind: &str, opt: &mut dyn ParamGroupLr) -> Sched {
    let boxed: Box<dyn LrScheduler> = match kind {
        "StepLR" => Box::new(StepLR::new(opt, 3, 0.5).unwrap()),
        "MultiStepLR" => Box::new(MultiStepLR::new(opt, &[2, 5, 5, 9], 0.3).unwrap()),
        "ExponentialLR" => Box::new(ExponentialLR::new(opt, 0.9).unwrap()),
        "CosineAnnealingLR" => Box::new(CosineAnnealingLR::new(opt, 7, 1e-4).unwrap()),
        "CosineAnnealingWarmRestarts" => {
            Box::new(CosineAnnealingWarmRestarts::new(opt, 3, 2, 1e-4).unwrap())
        }
        "LinearLR" => Box::new(LinearLR::new(opt, 0.2, 1.0, 6).unwrap()),
        "ConstantLR" => Box::new(ConstantLR::new(opt, 0.5, 4).unwrap()),
        "LambdaLR" => Box::new(LambdaLR::new(opt, |e| 1.0 / (1.0 + e as f64)).unwrap()),
        "MultiplicativeLR" => Box::new(MultiplicativeLR::new(opt, |_| 0.95).unwrap()),
        "PolynomialLR" => Box::new(PolynomialLR::new(opt, 8, 2.0).unwrap()),
        "OneCycleLR" => {
            Box::new(OneCycleLR::new(opt, 0.2, 12, OneCycleOptions::default()).unwrap())
        }
        "OneCycleLR-linear-3" => {
            let o = OneCycleOptions {
                anneal_strategy: Anneal::Linear,
                three_phase: true,
                ..Default::default()
            };
            Box::new(OneCycleLR::new(opt, 0.2, 12, o).unwrap())
        }
        "CyclicLR" => {
            let o = CyclicOptions {
                step_size_up: 3,
                mode: CyclicMode::Triangular2,
                ..Default::default()
            };
            Box::new(CyclicLR::new(opt, 0.001, 0.1, o).unwrap())
        }
        "SequentialLR" => {
            let a = Box::new(LinearLR::new(opt, 0.1, 1.0, 3).unwrap());
            let b = Box::new(CosineAnnealingLR::new(opt, 5, 0.0).unwrap());
            let c = Box::new(StepLR::new(opt, 2, 0.5).unwrap());
            Box::new(SequentialLR::new(opt, vec![a, b, c], &[3, 8]).unwrap())
        }
        "ChainedScheduler" => {
            let a = Box::new(ConstantLR::new(opt, 0.5, 4).unwrap());
            let b = Box::new(ExponentialLR::new(opt, 0.95).unwrap());
            Box::new(ChainedScheduler::new(opt, vec![a, b]).unwrap())
        }
        _ => return Sched::Metric(ReduceLROnPlateau::new(opt, plateau()).unwrap()),
    };
    Sched::Step(boxed)
}

fn plateau() -> PlateauOptions {
    PlateauOptions {
        patience: 1,
        cooldown: 1,
        ..Default::default()
    }
}

fn adamw() -> kiln::optim::Adam {
    let param = |fill: f32| {
        Parameter::new(Tensor::from_vec(vec![fill; 2], &[2], Device::Cpu).unwrap()).unwrap()
    };
    AdamW::new(
        vec![
            ParamGroup::new(vec![("a".into(), param(0.5))]).lr(0.1),
            ParamGroup::new(vec![("b".into(), param(-0.5))]).lr(0.02),
        ],
        AdamOptions::adamw(),
    )
    .unwrap()
}

#[derive(Debug)]
pub struct Case {
    kind: &'static str,
    on_adamw: bool,
    state: Value,
}

pub fn state_dicts(seed: u64, cases: usize) {
    let generate = |rng: &mut Rng| {
        let kind = rng.pick(&KINDS);
        let on_adamw = rng.chance(0.25);
        let steps_before = rng.below(6);
        let mut opt = LrGroups::with_momentum(&[0.1, 0.02], 0.9);
        let mut s = make(kind, &mut opt);
        for i in 0..steps_before {
            s.step(&mut opt, 1.0 / (1 + i) as f64);
        }
        let mut state = s.state_dict();
        mutate(&mut state, rng);
        Case {
            kind,
            on_adamw,
            state,
        }
    };
    let check = |case: &Case| {
        let mut groups = LrGroups::with_momentum(&[0.1, 0.02], 0.9);
        let mut optimizer = adamw();
        let opt: &mut dyn ParamGroupLr = if case.on_adamw {
            &mut optimizer
        } else {
            &mut groups
        };
        let mut s = make(case.kind, opt);
        let before = s.state_dict();
        let loaded = s.load(&case.state);
        if !loaded {
            assert_eq!(
                s.state_dict(),
                before,
                "a refused load changed the scheduler"
            );
        }
        for i in 0..20 {
            let metric = [1.0, 0.5, f64::NAN, 2.0][i % 4];
            if s.step(opt, metric) {
                assert_eq!(s.last_lr().len(), 2);
            }
        }
        let _ = s.state_dict();
        if loaded {
            Outcome::Accepted
        } else {
            Outcome::Refused
        }
    };
    run("scheduler state dicts", seed, cases, generate, check);
}

/// Constructor arguments: hostile counts, factors and per-group lists for every scheduler,
/// then 30 steps (and a fractional `step_to` for warm restarts). Building may refuse.
#[derive(Debug)]
pub struct Build {
    kind: &'static str,
    count: usize,
    second: usize,
    factor: f64,
    other: f64,
    list: Vec<f64>,
    on_adamw: bool,
}

fn hostile_f64(rng: &mut Rng) -> f64 {
    let any = rng.next_u64() as f64 / u64::MAX as f64;
    rng.pick(&[
        0.0,
        -0.0,
        1.0,
        0.5,
        1e-300,
        -1.0,
        2.0,
        1e300,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        any,
    ])
}

pub fn constructors(seed: u64, cases: usize) {
    let generate = |rng: &mut Rng| {
        let len = rng.pick(&[0, 1, 2, 3]);
        Build {
            kind: rng.pick(&KINDS),
            count: rng.size(),
            second: rng.size(),
            factor: hostile_f64(rng),
            other: hostile_f64(rng),
            list: (0..len).map(|_| hostile_f64(rng)).collect(),
            on_adamw: rng.chance(0.3),
        }
    };
    let check = |b: &Build| {
        let mut groups = LrGroups::with_momentum(&[0.1, 0.02], 0.9);
        let mut optimizer = adamw();
        let opt: &mut dyn ParamGroupLr = if b.on_adamw {
            &mut optimizer
        } else {
            &mut groups
        };
        let (n, m, f, g) = (b.count, b.second, b.factor, b.other);
        let list = kiln::sched::PerGroup::Each(b.list.clone());
        let built: Result<Sched, kiln::sched::SchedError> = (|| {
            let s: Box<dyn LrScheduler> = match b.kind {
                "StepLR" => Box::new(StepLR::new(opt, n, f)?),
                "MultiStepLR" => Box::new(MultiStepLR::new(opt, &[n.min(m), n.max(m)], f)?),
                "ExponentialLR" => Box::new(ExponentialLR::new(opt, f)?),
                "CosineAnnealingLR" => Box::new(CosineAnnealingLR::new(opt, n, f)?),
                "CosineAnnealingWarmRestarts" => {
                    let mut w = CosineAnnealingWarmRestarts::new(opt, n, m, f)?;
                    let _ = w.step_to(opt, g);
                    Box::new(w)
                }
                "LinearLR" => Box::new(LinearLR::new(opt, f, g, n)?),
                "ConstantLR" => Box::new(ConstantLR::new(opt, f, n)?),
                "LambdaLR" => Box::new(LambdaLR::new(opt, move |e| f.powf(e as f64))?),
                "MultiplicativeLR" => Box::new(MultiplicativeLR::new(opt, move |_| f)?),
                "PolynomialLR" => Box::new(PolynomialLR::new(opt, n, f)?),
                "OneCycleLR" | "OneCycleLR-linear-3" => {
                    let o = OneCycleOptions {
                        pct_start: g,
                        anneal_strategy: if m % 2 == 0 {
                            Anneal::Cos
                        } else {
                            Anneal::Linear
                        },
                        three_phase: b.kind != "OneCycleLR",
                        div_factor: if m % 3 == 0 { f } else { 25.0 },
                        base_momentum: list.clone(),
                        ..Default::default()
                    };
                    Box::new(OneCycleLR::new(opt, f, n, o)?)
                }
                "CyclicLR" => {
                    let o = CyclicOptions {
                        step_size_up: n,
                        step_size_down: Some(m),
                        mode: [
                            CyclicMode::Triangular,
                            CyclicMode::Triangular2,
                            CyclicMode::ExpRange,
                        ][m % 3],
                        gamma: g,
                        max_momentum: list.clone(),
                        ..Default::default()
                    };
                    Box::new(CyclicLR::new(opt, f, g, o)?)
                }
                "SequentialLR" => {
                    let a = Box::new(LinearLR::new(opt, 0.5, 1.0, 3)?);
                    let c = Box::new(StepLR::new(opt, 2, 0.5)?);
                    Box::new(SequentialLR::new(opt, vec![a, c], &[n])?)
                }
                "ChainedScheduler" => {
                    let a = Box::new(ExponentialLR::new(opt, f)?);
                    Box::new(ChainedScheduler::new(opt, vec![a])?)
                }
                _ => {
                    let o = PlateauOptions {
                        factor: f,
                        patience: n,
                        threshold: g,
                        cooldown: m,
                        min_lr: list.clone(),
                        eps: g,
                        ..Default::default()
                    };
                    return Ok(Sched::Metric(ReduceLROnPlateau::new(opt, o)?));
                }
            };
            Ok(Sched::Step(s))
        })();
        let mut s = match built {
            Ok(s) => s,
            Err(e) => return refused(e),
        };
        for i in 0..30 {
            s.step(opt, [1.0, f, f64::NAN][i % 3]);
        }
        let state = s.state_dict();
        assert!(s.load(&state), "a scheduler's own state must load back");
        Outcome::Accepted
    };
    run(
        "scheduler constructor arguments",
        seed,
        cases,
        generate,
        check,
    );
}
