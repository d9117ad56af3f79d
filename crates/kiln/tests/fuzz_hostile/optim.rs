//! Optimizer and loss-scaler state dicts: a valid state of SGD (momentum, Nesterov), Adam
//! (amsgrad) or AdamW after a few steps, or of a GradScaler after a few updates, turned into
//! JSON, mutated (`json_mutation`, as the scheduler target's: hostile numbers, cut or grown
//! lists, swapped types), read back and loaded into a fresh object of the same kind, then stepped. A
//! load may refuse; nothing may panic, a refused load must leave the object as it was, and an
//! accepted one must leave it usable: steps from finite gradients keep finite parameters while
//! every loaded number is moderate, and a scaler's scale stays finite and its growth tracker
//! below its interval.

use crate::harness::{refused, run, Outcome, Rng};
use crate::json_mutation::mutate;
use kiln::autograd::{Device, Parameter, Tensor};
use kiln::optim::{
    Adam, AdamOptions, AdamW, GradScaler, GradScalerOptions, GradScalerState, Optimizer,
    ParamGroup, Sgd, SgdOptions, StateDict,
};
use serde_json::Value;

const KINDS: [&str; 4] = ["SGD", "SGD-nesterov", "Adam-amsgrad", "AdamW"];

fn params() -> Vec<ParamGroup> {
    let p = |n: usize, fill: f32| {
        Parameter::new(Tensor::from_vec(vec![fill; n], &[n], Device::Cpu).unwrap()).unwrap()
    };
    vec![
        ParamGroup::new(vec![("a".into(), p(2, 0.5))]).lr(0.1),
        ParamGroup::new(vec![("b".into(), p(3, -0.5)), ("c".into(), p(1, 2.0))]).lr(0.02),
    ]
}

fn make(kind: &str) -> Box<dyn Optimizer> {
    match kind {
        "SGD" => Box::new(Sgd::new(params(), SgdOptions::default().momentum(0.9)).unwrap()),
        "SGD-nesterov" => Box::new(
            Sgd::new(
                params(),
                SgdOptions::default()
                    .momentum(0.9)
                    .nesterov(true)
                    .weight_decay(0.01),
            )
            .unwrap(),
        ),
        "Adam-amsgrad" => {
            Box::new(Adam::new(params(), AdamOptions::default().amsgrad(true)).unwrap())
        }
        _ => Box::new(AdamW::new(params(), AdamOptions::adamw()).unwrap()),
    }
}

/// Gives every parameter the gradient `0.25 * (i + 1)` and steps; returns whether it stepped.
fn step(opt: &mut dyn Optimizer) -> bool {
    for (i, (_, p)) in opt.named_params().iter().enumerate() {
        let n = p.tensor().numel();
        let g = Tensor::from_vec(vec![0.25 * (i + 1) as f32; n], &[n], Device::Cpu).unwrap();
        p.tensor().set_grad(Some(g)).unwrap();
    }
    opt.step().is_ok()
}

/// Every number in `v` is at most 1000 in size (bounded options and moments: three steps from
/// them cannot overflow f32, so the parameters must stay finite; huge loaded values may
/// overflow, as in PyTorch).
fn moderate(v: &Value) -> bool {
    match v {
        Value::Number(n) => n.as_f64().is_some_and(|x| x.abs() <= 1e3),
        Value::Array(items) => items.iter().all(moderate),
        Value::Object(map) => map.values().all(moderate),
        _ => true,
    }
}

#[derive(Debug)]
pub struct OptimCase {
    kind: &'static str,
    state: Value,
}

pub fn optimizer_state_dicts(seed: u64, cases: usize) {
    let generate = |rng: &mut Rng| {
        let kind = rng.pick(&KINDS);
        let mut opt = make(kind);
        for _ in 0..rng.below(4) {
            step(opt.as_mut());
        }
        let mut state = serde_json::to_value(opt.state_dict().unwrap()).unwrap();
        mutate(&mut state, rng);
        OptimCase { kind, state }
    };
    let check = |case: &OptimCase| {
        let Ok(sd) = serde_json::from_value::<StateDict>(case.state.clone()) else {
            return Outcome::Refused;
        };
        let mut opt = make(case.kind);
        step(opt.as_mut());
        let before = opt.state_dict().unwrap();
        if let Err(e) = opt.load_state_dict(&sd) {
            assert_eq!(
                opt.state_dict().unwrap(),
                before,
                "a refused load changed the optimizer"
            );
            return refused(e);
        }
        let bounded = moderate(&case.state);
        for _ in 0..3 {
            if step(opt.as_mut()) && bounded {
                for (_, p) in opt.named_params() {
                    let values = p.tensor().to_vec_f64().unwrap();
                    assert!(
                        values.iter().all(|v| v.is_finite()),
                        "a loaded state made parameters non-finite: {values:?}"
                    );
                }
            }
        }
        let _ = opt.state_dict();
        Outcome::Accepted
    };
    run("optimizer state dicts", seed, cases, generate, check);
}

#[derive(Debug)]
pub struct ScalerCase {
    state: Value,
    found_inf: Vec<bool>,
}

pub fn grad_scaler_states(seed: u64, cases: usize) {
    let generate = |rng: &mut Rng| {
        let mut scaler = GradScaler::new(GradScalerOptions {
            growth_interval: 1 + rng.below(4) as u64,
            ..GradScalerOptions::default()
        })
        .unwrap();
        let mut opt = make("SGD");
        for _ in 0..rng.below(4) {
            step_scaled(&mut scaler, opt.as_mut(), rng.chance(0.3));
        }
        let mut state = serde_json::to_value(scaler.state_dict()).unwrap();
        mutate(&mut state, rng);
        ScalerCase {
            state,
            found_inf: (0..6).map(|_| rng.chance(0.3)).collect(),
        }
    };
    let check = |case: &ScalerCase| {
        let Ok(state) = serde_json::from_value::<GradScalerState>(case.state.clone()) else {
            return Outcome::Refused;
        };
        let mut scaler = GradScaler::new(GradScalerOptions::default()).unwrap();
        let before = scaler.state_dict();
        if let Err(e) = scaler.load_state_dict(&state) {
            assert_eq!(
                scaler.state_dict(),
                before,
                "a refused load changed the scaler"
            );
            return refused(e);
        }
        let mut opt = make("AdamW");
        for &inf in &case.found_inf {
            step_scaled(&mut scaler, opt.as_mut(), inf);
            let scale = scaler.get_scale();
            // A backoff factor as small as 5e-324 is legal (PyTorch's range, (0, 1)) and can
            // take the f32 scale to 0, as in PyTorch; never to inf, NaN or below 0.
            assert!(
                scale.is_finite() && scale >= 0.0,
                "the scale became {scale} after loading {state:?}"
            );
            let s = scaler.state_dict();
            assert!(
                s.growth_tracker < s.growth_interval,
                "growth tracker {} not below the interval {}",
                s.growth_tracker,
                s.growth_interval
            );
        }
        Outcome::Accepted
    };
    run("grad scaler states", seed, cases, generate, check);
}

/// One scaled step: gradients of `scale * 0.5` (or inf), `step`, `update`.
fn step_scaled(scaler: &mut GradScaler, opt: &mut dyn Optimizer, inf: bool) {
    let scale = scaler.get_scale() as f32;
    for (_, p) in opt.named_params() {
        let n = p.tensor().numel();
        let g = if inf { f32::INFINITY } else { 0.5 * scale };
        let grad = Tensor::from_vec(vec![g; n], &[n], Device::Cpu).unwrap();
        p.tensor().set_grad(Some(grad)).unwrap();
    }
    let _ = scaler.step(opt);
    let _ = scaler.update();
}
