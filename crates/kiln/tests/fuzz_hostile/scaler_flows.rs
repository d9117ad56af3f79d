//! `GradScaler` flows against a reference of its rules (PyTorch 2.15's `torch.amp.GradScaler`
//! where kiln follows it): hostile options (scales out of f32's range, 0, NaN; factors at and
//! past their bounds; interval 0), enabled or not, and random sequences of `scale`, gradients
//! (NaN, infinite, near f32's limit, missing), `unscale_`, `step` (SGD), `update` and
//! `set_scale`, in and out of order, over f32 and f64 parameters.
//!
//! After every call: refused where the reference refuses, and otherwise the scale, the growth
//! tracker, whether the step was taken, `scale`'s output, every gradient and every parameter
//! equal the reference's bit for bit.
//!
//! Where kiln deliberately differs from PyTorch (its rules, written in `GradScaler`'s docs):
//! the options must be valid (positive, finite scale within f32's range; growth above 1;
//! backoff in (0, 1); interval at least 1), and so must `set_scale`'s scale (PyTorch takes
//! any); the unscale flags a gradient that is non-finite after it (PyTorch looks before it and
//! steps with one the unscale overflowed); an `unscale_` that finds no gradient records nothing
//! (PyTorch records an empty check, and a second `unscale_` is then refused). Scales below
//! `1 / f32::MAX`, where the unscale's `1 / scale` is inf in f32, are refused by the options,
//! by `set_scale` and by an `update` whose backoff would reach one (it keeps the scale; PyTorch
//! backs off on down to 0 and skips every later step).

use crate::harness::{run, Outcome, Rng};
use crate::numeric::{float_tensor, round_to};
use kiln::autograd::{Device, Parameter, Tensor};
use kiln::optim::{GradScaler, GradScalerOptions, ParamGroup, Sgd, SgdOptions};

#[derive(Debug, Clone)]
pub enum Action {
    /// A gradient per parameter (`None`: none).
    Grads(Vec<Option<Vec<f64>>>),
    Scale(f64),
    Unscale,
    Step,
    Update,
    SetScale(f64),
}

#[derive(Debug, Clone)]
pub struct FlowCase {
    options: GradScalerOptions,
    /// Per parameter: f32 or not, and its values.
    params: Vec<(bool, Vec<f64>)>,
    lr: f64,
    actions: Vec<Action>,
}

fn hostile_scale(rng: &mut Rng) -> f64 {
    match rng.below(3) {
        0 => rng.pick(&[
            0.0,
            -1.0,
            f64::NAN,
            f64::INFINITY,
            1e39,
            1e-46,
            1e-45,
            2.9e-39,
            3e-39,
            2f64.powi(127),
            f32::MAX as f64,
        ]),
        _ => rng.pick(&[0.25, 1.0, 3.0, 1024.0, 65536.0]),
    }
}

fn grad_value(rng: &mut Rng, scale: f64) -> f64 {
    match rng.below(16) {
        0 => f64::NAN,
        1 => rng.pick(&[f64::INFINITY, f64::NEG_INFINITY]),
        2 => rng.pick(&[3e38, -2e38, 1e-40, f64::MAX]),
        _ => (rng.below(9) as f64 - 4.0) / 4.0 * scale,
    }
}

fn generate(rng: &mut Rng) -> FlowCase {
    let options = GradScalerOptions {
        init_scale: hostile_scale(rng),
        growth_factor: match rng.chance(0.85) {
            true => rng.pick(&[2.0, 1.5, 4.0]),
            false => rng.pick(&[1.0, 0.5, f64::INFINITY, f64::NAN, 1e300]),
        },
        backoff_factor: match rng.chance(0.85) {
            true => rng.pick(&[0.5, 0.25]),
            false => rng.pick(&[0.0, 1.0, -0.5, f64::NAN, 1e-300]),
        },
        growth_interval: rng.pick(&[1, 2, 3, 3, 0]),
        enabled: rng.chance(0.9),
    };
    let params: Vec<(bool, Vec<f64>)> = (0..1 + rng.below(3))
        .map(|_| {
            let n = rng.below(4);
            let f32 = rng.chance(0.6);
            let v = (0..n).map(|_| (rng.below(9) as f64 - 4.0) / 2.0).collect();
            (f32, v)
        })
        .collect();
    let scale = options.init_scale.clamp(1e-30, 1e30);
    let mut actions = Vec::new();
    for _ in 0..2 + rng.below(5) {
        let grads = |rng: &mut Rng| {
            let g = params
                .iter()
                .map(|(_, v)| {
                    (rng.chance(0.85)).then(|| v.iter().map(|_| grad_value(rng, scale)).collect())
                })
                .collect();
            Action::Grads(g)
        };
        if rng.chance(0.7) {
            // The documented order, with a call sometimes doubled or left out.
            actions.push(grads(rng));
            if rng.chance(0.3) {
                actions.push(Action::Scale(rng.pick(&[0.5, 3.0, f64::NAN])));
            }
            for a in [Action::Unscale, Action::Step, Action::Update] {
                let times = match rng.below(10) {
                    0 => 0,
                    1 => 2,
                    _ => 1,
                };
                actions.extend(std::iter::repeat_n(a, times));
            }
        } else {
            actions.push(match rng.below(6) {
                0 => grads(rng),
                1 => Action::Unscale,
                2 => Action::Step,
                3 => Action::Update,
                4 => Action::SetScale(hostile_scale(rng)),
                _ => Action::Scale(1.5),
            });
        }
    }
    FlowCase {
        options,
        params,
        lr: rng.pick(&[1.0, 0.5, 0.25]),
        actions,
    }
}

/// The reference's state: the scaler's, and the parameters and gradients (as stored).
#[derive(Debug, Clone)]
struct Model {
    scale: f32,
    tracker: u64,
    /// `None`: nothing recorded since the last update; `(stepped, found_inf)` otherwise.
    stage: Option<(bool, bool)>,
    params: Vec<Vec<f64>>,
    grads: Vec<Option<Vec<f64>>>,
}

/// What one call gives: refused, or `Ok` with a step's answer or `scale`'s output.
#[derive(Debug, PartialEq)]
enum Answer {
    Refused,
    Done,
    Stepped(bool),
    Scaled(f32),
}

/// A scale kiln keeps: positive, finite in f32, and with a finite reciprocal in f32 (from
/// `1 / f32::MAX` up), so the unscale's `1 / scale` is finite.
fn valid_scale(v: f64) -> bool {
    let s = v as f32;
    v > 0.0 && s.is_finite() && ((1.0 / f64::from(s)) as f32).is_finite()
}

fn valid(o: &GradScalerOptions) -> bool {
    let factors = o.growth_factor > 1.0 && o.backoff_factor > 0.0 && o.backoff_factor < 1.0;
    factors && valid_scale(o.init_scale) && o.growth_interval > 0
}

impl Model {
    fn unscale(&mut self, case: &FlowCase) -> Answer {
        if self.stage.is_some() {
            return Answer::Refused;
        }
        let inv = (1.0 / f64::from(self.scale)) as f32;
        let mut found = None;
        for ((f32, _), g) in case.params.iter().zip(&mut self.grads) {
            for v in g.iter_mut().flatten() {
                *v = match f32 {
                    true => f64::from(*v as f32 * inv),
                    false => *v * f64::from(inv),
                };
                found = Some(found.unwrap_or(false) | !v.is_finite());
            }
            if g.is_some() {
                found.get_or_insert(false);
            }
        }
        if let Some(found) = found {
            self.stage = Some((false, found));
        }
        Answer::Done
    }

    fn sgd(&mut self, case: &FlowCase) {
        for (((f32, _), p), g) in case.params.iter().zip(&mut self.params).zip(&self.grads) {
            if let Some(g) = g {
                for (x, d) in p.iter_mut().zip(g) {
                    // In the parameter's dtype, product then sum (an f32 product of subnormals
                    // rounds to a signed zero before the sum).
                    *x = match f32 {
                        true => f64::from(*x as f32 - case.lr as f32 * *d as f32),
                        false => *x - case.lr * d,
                    };
                }
            }
        }
    }

    fn apply(&mut self, case: &FlowCase, action: &Action) -> Answer {
        let enabled = case.options.enabled;
        match action {
            Action::Grads(g) => {
                self.grads = g
                    .iter()
                    .zip(&case.params)
                    .map(|(g, (f32, _))| {
                        g.as_ref()
                            .map(|g| g.iter().map(|&v| round_to(*f32, v)).collect())
                    })
                    .collect();
                Answer::Done
            }
            Action::Scale(loss) if enabled => Answer::Scaled(*loss as f32 * self.scale),
            Action::Scale(loss) => Answer::Scaled(*loss as f32),
            Action::Unscale if !enabled => Answer::Done,
            Action::Unscale => self.unscale(case),
            Action::Step if !enabled => {
                self.sgd(case);
                Answer::Stepped(true)
            }
            Action::Step => {
                if matches!(self.stage, Some((true, _))) {
                    return Answer::Refused;
                }
                if self.stage.is_none() {
                    self.unscale(case);
                }
                let Some((_, found)) = self.stage else {
                    return Answer::Refused;
                };
                if !found {
                    self.sgd(case);
                }
                self.stage = Some((true, found));
                Answer::Stepped(!found)
            }
            Action::Update if !enabled => Answer::Done,
            Action::Update => {
                let Some((_, found)) = self.stage.take() else {
                    return Answer::Refused;
                };
                let o = &case.options;
                if found {
                    let backed = (f64::from(self.scale) * o.backoff_factor) as f32;
                    if !valid_scale(f64::from(backed)) {
                        return Answer::Refused;
                    }
                    self.scale = backed;
                    self.tracker = 0;
                } else if self.tracker + 1 == o.growth_interval {
                    let grown = (f64::from(self.scale) * o.growth_factor) as f32;
                    if grown.is_finite() {
                        self.scale = grown;
                    }
                    self.tracker = 0;
                } else {
                    self.tracker += 1;
                }
                Answer::Done
            }
            Action::SetScale(v) if valid_scale(*v) => {
                self.scale = *v as f32;
                Answer::Done
            }
            Action::SetScale(_) => Answer::Refused,
        }
    }
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_vec_f64().unwrap()
}

fn same(what: &str, got: &[f64], want: &[f64]) {
    let eq = |(g, w): (&f64, &f64)| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
    assert!(
        got.len() == want.len() && got.iter().zip(want).all(eq),
        "{what}: kiln {got:?}, reference {want:?}"
    );
}

fn check(case: &FlowCase) -> Outcome {
    let scaler = GradScaler::new(case.options);
    if scaler.is_ok() != valid(&case.options) {
        panic!("options {:?}: kiln {scaler:?}", case.options);
    }
    let Ok(mut scaler) = scaler else {
        return Outcome::Refused;
    };
    let params: Vec<Parameter> = case
        .params
        .iter()
        .map(|(f32, v)| Parameter::new(float_tensor(v, &[v.len()], *f32, false)).unwrap())
        .collect();
    let named = params
        .iter()
        .enumerate()
        .map(|(i, p)| (format!("p{i}"), p.clone()))
        .collect();
    let mut opt = Sgd::new(
        vec![ParamGroup::new(named)],
        SgdOptions::default().lr(case.lr),
    )
    .unwrap();
    let mut model = Model {
        scale: case.options.init_scale as f32,
        tracker: 0,
        stage: None,
        params: case.params.iter().map(|(_, v)| v.clone()).collect(),
        grads: vec![None; params.len()],
    };
    for (k, action) in case.actions.iter().enumerate() {
        let want = model.apply(case, action);
        let got = match action {
            Action::Grads(g) => {
                for ((p, g), (f32, _)) in params.iter().zip(g).zip(&case.params) {
                    let t = g.as_ref().map(|g| float_tensor(g, &[g.len()], *f32, false));
                    p.tensor().set_grad(t).unwrap();
                }
                Answer::Done
            }
            Action::Scale(loss) => {
                let l = Tensor::from_vec(vec![*loss as f32], &[], Device::Cpu).unwrap();
                Answer::Scaled(scaler.scale(&l).unwrap().item().unwrap() as f32)
            }
            Action::Unscale => scaler
                .unscale_(&mut opt)
                .map_or(Answer::Refused, |_| Answer::Done),
            Action::Step => scaler
                .step(&mut opt)
                .map_or(Answer::Refused, Answer::Stepped),
            Action::Update => scaler.update().map_or(Answer::Refused, |_| Answer::Done),
            Action::SetScale(v) => scaler
                .set_scale(*v)
                .map_or(Answer::Refused, |_| Answer::Done),
        };
        let what = format!("action {k} ({action:?})");
        match (&got, &want) {
            (Answer::Scaled(g), Answer::Scaled(w)) => {
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "{what}: {g} vs {w}"
                )
            }
            _ => assert_eq!(got, want, "{what}"),
        }
        let scale = if case.options.enabled {
            f64::from(model.scale)
        } else {
            1.0
        };
        assert_eq!(
            scaler.get_scale().to_bits(),
            scale.to_bits(),
            "{what}: scale"
        );
        assert_eq!(
            scaler.growth_tracker(),
            model.tracker,
            "{what}: growth tracker"
        );
        for (i, p) in params.iter().enumerate() {
            same(
                &format!("{what}: parameter {i}"),
                &values(p.tensor()),
                &model.params[i],
            );
            match (p.grad(), &model.grads[i]) {
                (Some(g), Some(w)) => same(&format!("{what}: gradient {i}"), &values(&g), w),
                (None, None) => {}
                (g, w) => panic!("{what}: gradient {i}: kiln {g:?}, reference {w:?}"),
            }
        }
    }
    Outcome::Accepted
}

pub fn scaler_flows(seed: u64, cases: usize) {
    run(
        "GradScaler flows vs a reference",
        seed,
        cases,
        generate,
        check,
    );
}
