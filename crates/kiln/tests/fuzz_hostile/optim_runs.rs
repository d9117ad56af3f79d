//! Optimizer runs: SGD, Adam or AdamW built from hostile hyper-parameters (defaults and
//! per-group overrides: negative, NaN, infinite, out of range, an option the algorithm has not
//! got), parameter lists (empty tensors, frozen parameters, one parameter in two places, an
//! empty group or none), then stepped a few times with gradients that are sometimes missing or
//! hold NaN, infinities or huge values, each step sometimes after `set_lr` or a clip
//! (`clip_grad_norm_` with hostile `max_norm` / `norm_type`, `clip_coef_for` handed to
//! `step_with_grad_scale`, or `clip_grad_value_`).
//!
//! The check, against [`crate::optim_reference`]: construction, `set_lr` and each clip must be
//! refused exactly where the reference refuses; a clip's total norm and every parameter after
//! every step must equal the reference's (NaN or infinite where it is, else within f64 1e-9 /
//! f32 1e-4 of the larger of 1, the value and the parameter before the step).

use crate::harness::{run, Outcome, Rng};
use crate::numeric::{float_tensor, round_to};
use crate::optim_reference::{self as r, Algo, Clip, Hyper, Overrides, State};
use kiln::autograd::Parameter;
use kiln::optim::{clip_coef_for, clip_grad_norm_, clip_grad_value_, Adam, AdamOptions, AdamW};
use kiln::optim::{Optimizer, ParamGroup, Sgd, SgdOptions};

#[derive(Debug, Clone)]
pub struct ParamSpec {
    shape: Vec<usize>,
    values: Vec<f64>,
    frozen: bool,
    /// Lists an earlier parameter (by flat index) again instead of a new one.
    again: Option<usize>,
}

#[derive(Debug, Clone)]
pub struct StepSpec {
    /// One per parameter, in flat order (`None`: no gradient).
    grads: Vec<Option<Vec<f64>>>,
    set_lr: Option<f64>,
    clip: Option<Clip>,
}

#[derive(Debug)]
pub struct OptimRun {
    algo: Algo,
    f32: bool,
    defaults: Hyper,
    groups: Vec<(Vec<ParamSpec>, Overrides)>,
    steps: Vec<StepSpec>,
}

/// A usual value, or (8 %) a hostile one; huge ones only for f64 runs, whose reference cannot
/// overflow where kiln's f32 arithmetic would.
fn pick(rng: &mut Rng, usual: &[f64], f32: bool) -> f64 {
    if rng.chance(0.92) {
        return rng.pick(usual);
    }
    let mut hostile = vec![-1.0, f64::NAN, f64::INFINITY, 1.0, 0.0];
    if !f32 {
        hostile.extend([1e300, 1e-300]);
    }
    rng.pick(&hostile)
}

fn value(rng: &mut Rng, f32: bool) -> f64 {
    let v = -2.0 + 4.0 * rng.below(1 << 20) as f64 / (1 << 20) as f64;
    if f32 {
        v as f32 as f64
    } else {
        v
    }
}

fn hyper(rng: &mut Rng, f32: bool) -> Hyper {
    let betas = [(0.9, 0.999), (0.0, 0.0), (0.5, 0.9), (0.99, 0.5)];
    let hostile_betas = [
        (1.0, 0.9),
        (-0.1, 0.9),
        (f64::NAN, 0.9),
        (0.9, 1.0),
        (0.9, f64::NAN),
    ];
    Hyper {
        lr: pick(rng, &[1e-3, 0.1, 1.0, 0.0], f32),
        momentum: pick(rng, &[0.0, 0.9, 0.5], f32),
        dampening: pick(rng, &[0.0, 0.0, 0.1], f32),
        weight_decay: pick(rng, &[0.0, 0.01, 0.1], f32),
        nesterov: rng.chance(0.15),
        betas: if rng.chance(0.92) {
            rng.pick(&betas)
        } else {
            rng.pick(&hostile_betas)
        },
        eps: pick(rng, &[1e-8, 1e-3, 0.0], f32),
        amsgrad: rng.chance(0.3),
        maximize: rng.chance(0.2),
    }
}

fn overrides(rng: &mut Rng, f32: bool) -> Overrides {
    let h = hyper(rng, f32);
    let mut some = |p: f64| rng.chance(p);
    Overrides {
        lr: some(0.3).then_some(h.lr),
        momentum: some(0.05).then_some(h.momentum),
        dampening: some(0.03).then_some(h.dampening),
        weight_decay: some(0.15).then_some(h.weight_decay),
        nesterov: some(0.03).then_some(h.nesterov),
        betas: some(0.05).then_some(h.betas),
        eps: some(0.03).then_some(h.eps),
        amsgrad: some(0.03).then_some(h.amsgrad),
        maximize: some(0.1).then_some(h.maximize),
    }
}

fn grad(rng: &mut Rng, n: usize, f32: bool) -> Vec<f64> {
    let mut hostile = vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0];
    if !f32 {
        hostile.extend([1e300, 1e-300]);
    }
    (0..n)
        .map(|_| match rng.chance(0.03) {
            true => rng.pick(&hostile),
            false => value(rng, f32),
        })
        .collect()
}

fn clip(rng: &mut Rng) -> Option<Clip> {
    let max_norm = rng.pick(&[1.0, 0.5, 0.1, 0.0, f64::INFINITY, -1.0, f64::NAN]);
    let norm_type = rng.pick(&[
        2.0,
        2.0,
        1.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        3.0,
        0.5,
    ]) * if rng.chance(0.1) { -1.0 } else { 1.0 };
    let norm_type = if rng.chance(0.03) {
        f64::NAN
    } else {
        norm_type
    };
    Some(match rng.below(8) {
        0 | 1 => Clip::Norm {
            max_norm,
            norm_type,
            error_if_nonfinite: rng.chance(0.5),
        },
        2 => Clip::Fused {
            max_norm,
            norm_type,
        },
        3 => Clip::Value(rng.pick(&[0.5, 1.0, 0.0, f64::INFINITY, -1.0, f64::NAN])),
        _ => return None,
    })
}

fn generate(rng: &mut Rng) -> OptimRun {
    let f32 = rng.chance(0.3);
    let n_groups = if rng.chance(0.03) {
        0
    } else {
        1 + rng.below(3)
    };
    let mut flat = 0;
    let mut groups = Vec::new();
    for _ in 0..n_groups {
        let n = if rng.chance(0.03) {
            0
        } else {
            1 + rng.below(3)
        };
        let mut params = Vec::new();
        for _ in 0..n {
            let rank = rng.below(3);
            let shape: Vec<usize> = (0..rank).map(|_| rng.below(4)).collect();
            let count = shape.iter().product();
            let again = (flat > 0 && rng.chance(0.03)).then(|| rng.below(flat));
            params.push(ParamSpec {
                values: (0..count).map(|_| value(rng, f32)).collect(),
                shape,
                frozen: rng.chance(0.1),
                again,
            });
            flat += 1;
        }
        groups.push((params, overrides(rng, f32)));
    }
    let specs: Vec<&ParamSpec> = groups.iter().flat_map(|(p, _)| p).collect();
    let steps = (0..1 + rng.below(3))
        .map(|_| StepSpec {
            grads: specs
                .iter()
                .map(|p| (!p.frozen && rng.chance(0.85)).then(|| grad(rng, p.values.len(), f32)))
                .collect(),
            set_lr: rng
                .chance(0.1)
                .then(|| rng.pick(&[0.2, -0.5, f64::NAN, f64::INFINITY])),
            clip: clip(rng),
        })
        .collect();
    OptimRun {
        algo: rng.pick(&[Algo::Sgd, Algo::Adam, Algo::AdamW]),
        f32,
        defaults: hyper(rng, f32),
        groups,
        steps,
    }
}

fn group(params: Vec<(String, Parameter)>, o: &Overrides) -> ParamGroup {
    let mut g = ParamGroup::new(params);
    macro_rules! set {
        ($($f:ident),*) => {$(if let Some(v) = o.$f { g = g.$f(v); })*};
    }
    set!(
        lr,
        momentum,
        dampening,
        weight_decay,
        nesterov,
        betas,
        eps,
        amsgrad,
        maximize
    );
    g
}

/// The run's optimizer, or kiln's refusal; and its parameters in flat order.
fn build(run: &OptimRun) -> (Option<Box<dyn Optimizer>>, Vec<Parameter>) {
    let mut flat: Vec<Parameter> = Vec::new();
    let mut groups = Vec::new();
    for (specs, o) in &run.groups {
        let mut params = Vec::new();
        for p in specs {
            let param = match p.again {
                Some(k) => flat[k].clone(),
                None => Parameter::new(float_tensor(&p.values, &p.shape, run.f32, false)).unwrap(),
            };
            if p.frozen {
                param.tensor().set_requires_grad(false).unwrap();
            }
            params.push((format!("p{}", flat.len()), param.clone()));
            flat.push(param);
        }
        groups.push(group(params, o));
    }
    let h = run.defaults;
    let opt: Option<Box<dyn Optimizer>> = match run.algo {
        Algo::Sgd => {
            let d = SgdOptions {
                lr: h.lr,
                momentum: h.momentum,
                dampening: h.dampening,
                weight_decay: h.weight_decay,
                nesterov: h.nesterov,
                maximize: h.maximize,
            };
            Sgd::new(groups, d).ok().map(|o| Box::new(o) as _)
        }
        Algo::Adam | Algo::AdamW => {
            let d = AdamOptions {
                lr: h.lr,
                betas: h.betas,
                eps: h.eps,
                weight_decay: h.weight_decay,
                amsgrad: h.amsgrad,
                maximize: h.maximize,
            };
            match run.algo {
                Algo::Adam => Adam::new(groups, d).ok().map(|o| Box::new(o) as _),
                _ => AdamW::new(groups, d).ok().map(|o| Box::new(o) as _),
            }
        }
    };
    (opt, flat)
}

/// The reference's groups (resolved options, flat indices), or `None` where kiln refuses.
fn reference_groups(run: &OptimRun) -> Option<Vec<(Hyper, Vec<usize>)>> {
    let none = Overrides::default();
    r::resolve(run.algo, &run.defaults, &none)?;
    let any_again = run
        .groups
        .iter()
        .flat_map(|(p, _)| p)
        .any(|p| p.again.is_some());
    if run.groups.is_empty() || any_again || run.groups.iter().any(|(p, _)| p.is_empty()) {
        return None;
    }
    let mut flat = 0;
    let mut out = Vec::new();
    for (specs, o) in &run.groups {
        let h = r::resolve(run.algo, &run.defaults, o)?;
        out.push((h, (flat..flat + specs.len()).collect()));
        flat += specs.len();
    }
    Some(out)
}

fn close(got: f64, want: f64, before: f64, f32: bool) -> bool {
    if !want.is_finite() {
        return !got.is_finite();
    }
    let tol = if f32 { 1e-4 } else { 1e-9 };
    (got - want).abs() <= tol * want.abs().max(before.abs()).max(1.0)
}

/// Runs the clip on kiln and the reference: the grad scale for the step, or `Err` when both
/// refused. Panics when they disagree.
fn clip_both(
    clip: Clip,
    opt: &dyn Optimizer,
    grads: &mut [Option<Vec<f64>>],
    f32: bool,
) -> Result<f64, ()> {
    let params = opt.named_params();
    let present: Vec<&[f64]> = grads.iter().flatten().map(|g| &g[..]).collect();
    let scale_all = |grads: &mut [Option<Vec<f64>>], f: &dyn Fn(f64) -> f64| {
        for g in grads.iter_mut().flatten() {
            g.iter_mut().for_each(|x| *x = round_to(f32, f(*x)));
        }
    };
    match clip {
        Clip::Norm {
            max_norm,
            norm_type,
            error_if_nonfinite,
        } => {
            let total = r::total_norm(&present, norm_type).filter(|_| max_norm >= 0.0);
            let total = total.filter(|t| t.is_finite() || !error_if_nonfinite);
            let got = clip_grad_norm_(&params, max_norm, norm_type, error_if_nonfinite);
            match (total, got) {
                (None, Err(_)) => return Err(()),
                (Some(want), Ok(got)) => {
                    assert!(
                        close(got, want, 0.0, f32),
                        "total norm: kiln {got}, reference {want}"
                    );
                    let coef = r::clip_coef(max_norm, want);
                    // Scaled unless the coefficient is 1 (a NaN one scales, as in PyTorch).
                    if coef < 1.0 || coef.is_nan() {
                        scale_all(grads, &|x| x * coef);
                    }
                }
                (want, got) => panic!("clip_grad_norm_: reference {want:?}, kiln {got:?}"),
            }
            Ok(1.0)
        }
        Clip::Fused {
            max_norm,
            norm_type,
        } => {
            let total = r::total_norm(&present, norm_type).filter(|_| max_norm >= 0.0);
            match (total, clip_coef_for(&params, max_norm, norm_type, false)) {
                (None, Err(_)) => Err(()),
                (Some(want), Ok(info)) => {
                    let ok = close(info.total_norm, want, 0.0, f32);
                    assert!(ok, "clip_coef_for: kiln {info:?}, reference {want}");
                    Ok(r::clip_coef(max_norm, want))
                }
                (want, got) => panic!("clip_coef_for: reference {want:?}, kiln {got:?}"),
            }
        }
        Clip::Value(v) => {
            let got = clip_grad_value_(&params, v);
            assert_eq!(got.is_ok(), v >= 0.0, "clip_grad_value_({v}): {got:?}");
            if got.is_err() {
                return Err(());
            }
            scale_all(grads, &|x| if x.is_nan() { x } else { x.clamp(-v, v) });
            Ok(1.0)
        }
    }
}

fn check(run: &OptimRun) -> Outcome {
    let (opt, flat) = build(run);
    let Some(mut groups) = reference_groups(run) else {
        assert!(
            opt.is_none(),
            "kiln built an optimizer the reference refuses"
        );
        return Outcome::Refused;
    };
    let mut opt = opt.expect("kiln refused an optimizer the reference builds");
    let specs: Vec<&ParamSpec> = run.groups.iter().flat_map(|(p, _)| p).collect();
    let mut params: Vec<Vec<f64>> = specs.iter().map(|p| p.values.clone()).collect();
    let mut states = vec![State::default(); flat.len()];
    for step in &run.steps {
        if let Some(lr) = step.set_lr {
            let got = opt.set_lr(0, lr);
            assert_eq!(got.is_ok(), lr.is_finite(), "set_lr({lr}): {got:?}");
            if lr.is_finite() {
                groups[0].0.lr = lr;
            }
        }
        let mut grads = step.grads.clone();
        for (p, g) in flat.iter().zip(&grads) {
            let g = g
                .as_ref()
                .map(|g| float_tensor(g, p.tensor().shape(), run.f32, false));
            p.tensor().set_grad(g).unwrap();
        }
        // A refused clip must leave the gradients as they were: the step then reads them.
        let scale = match step.clip {
            Some(c) => clip_both(c, opt.as_ref(), &mut grads, run.f32).unwrap_or(1.0),
            None => 1.0,
        };
        opt.step_with_grad_scale(scale)
            .expect("a step of valid gradients");
        let before = params.clone();
        for (h, members) in &groups {
            for &i in members {
                let Some(g) = &grads[i] else { continue };
                let g: Vec<f64> = g.iter().map(|x| x * scale).collect();
                r::step(run.algo, h, &mut params[i], &g, &mut states[i]);
                params[i]
                    .iter_mut()
                    .for_each(|v| *v = round_to(run.f32, *v));
            }
        }
        for (i, p) in flat.iter().enumerate() {
            let got = p.tensor().to_vec_f64().unwrap();
            for (k, (&g, &w)) in got.iter().zip(&params[i]).enumerate() {
                let ok = close(g, w, before[i][k], run.f32);
                assert!(ok, "parameter {i} element {k}: kiln {g}, reference {w}");
            }
        }
    }
    Outcome::Accepted
}

/// The optimizer-run fuzz target.
pub fn optimizer_runs(seed: u64, cases: usize) {
    run(
        "optimizer runs vs an f64 reference",
        seed,
        cases,
        generate,
        check,
    );
}
