//! OneCycleLR with linear annealing, stepped its full `total_steps` times through kiln's SGD
//! and AdamW, against PyTorch's own run (`fixtures/onecycle_end.json`, made by
//! `fixtures/gen_onecycle_end.py` with torch's OneCycleLR, SGD and AdamW): every step's
//! `get_last_lr`, the optimizer's lrs and momenta match to 1e-12 relative, the last step's
//! slightly negative lr (the last phase extrapolated one step past its end) included.

use kiln_autograd::{DType, Device, Parameter, Tensor};
use kiln_optim::{AdamOptions, AdamW, Optimizer, ParamGroup, Sgd, SgdOptions};
use kiln_sched::{Anneal, LrScheduler, OneCycleLR, OneCycleOptions, ParamGroupLr, PerGroup};
use serde_json::Value;

fn close(got: f64, want: f64, what: &str) {
    let tol = 1e-12 * want.abs().max(1e-12);
    assert!(
        (got - want).abs() <= tol,
        "{what}: kiln {got}, PyTorch {want}"
    );
}

fn rows(case: &Value, key: &str) -> Vec<Vec<f64>> {
    case[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect()
        })
        .collect()
}

fn groups(lrs: &[f64]) -> Vec<ParamGroup> {
    lrs.iter()
        .enumerate()
        .map(|(i, &lr)| {
            let p = Parameter::new(Tensor::zeros(&[2], DType::F32, Device::Cpu).unwrap()).unwrap();
            ParamGroup::new(vec![(format!("p{i}"), p)]).lr(lr)
        })
        .collect()
}

fn run_case<O: Optimizer + ParamGroupLr>(case: &Value, mut opt: O) -> usize {
    let name = case["name"].as_str().unwrap();
    let total = case["total_steps"].as_u64().unwrap() as usize;
    let max_lr = match &case["max_lr"] {
        Value::Array(v) => PerGroup::Each(v.iter().map(|x| x.as_f64().unwrap()).collect()),
        x => PerGroup::All(x.as_f64().unwrap()),
    };
    let options = OneCycleOptions {
        anneal_strategy: Anneal::Linear,
        three_phase: case["three_phase"].as_bool().unwrap(),
        pct_start: case["pct_start"].as_f64().unwrap(),
        ..Default::default()
    };
    let mut sched = OneCycleLR::new(&mut opt, max_lr, total, options).unwrap();
    let (last_lr, opt_lr, opt_m) = (
        rows(case, "last_lr"),
        rows(case, "opt_lr"),
        rows(case, "opt_momentum"),
    );
    assert_eq!(last_lr.len(), total + 1);
    for step in 0..=total {
        if step > 0 {
            sched.step(&mut opt).unwrap();
        }
        for g in 0..last_lr[step].len() {
            let at = format!("{name} step {step} group {g}");
            close(
                sched.get_last_lr()[g],
                last_lr[step][g],
                &format!("{at} get_last_lr"),
            );
            close(
                Optimizer::lr(&opt, g).unwrap(),
                opt_lr[step][g],
                &format!("{at} lr"),
            );
            let m = Optimizer::momentum(&opt, g).unwrap().unwrap();
            close(m, opt_m[step][g], &format!("{at} momentum"));
        }
    }
    assert!(
        sched.get_last_lr().iter().all(|&lr| lr < 0.0),
        "{name}: PyTorch's final lr is negative"
    );
    total
}

#[test]
fn onecycle_linear_final_step_matches_pytorch_through_kiln_optimizers() {
    let fixture: Value = serde_json::from_str(include_str!("fixtures/onecycle_end.json")).unwrap();
    let mut steps = 0;
    for case in fixture["cases"].as_array().unwrap() {
        let lrs: Vec<f64> = case["group_lrs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        steps += match case["optimizer"].as_str().unwrap() {
            "adamw" => run_case(
                case,
                AdamW::new(groups(&lrs), AdamOptions::adamw()).unwrap(),
            ),
            "sgd" => run_case(
                case,
                Sgd::new(groups(&lrs), SgdOptions::default().momentum(0.9)).unwrap(),
            ),
            other => panic!("unknown optimizer {other}"),
        };
    }
    assert_eq!(steps, 100 + 37 + 50);
}
