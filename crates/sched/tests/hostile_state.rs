//! Hostile state dicts and optimizer refusals: each case used to panic (index out of range,
//! division by zero, `rem_euclid(0)`, or `optim_impl.rs` unwrapping a refused lr); each is now a
//! typed error naming the field, and a failed load or step changes nothing.

use kiln_autograd::{Device, Parameter, Tensor};
use kiln_optim::{AdamOptions, AdamW, Optimizer, ParamGroup};
use kiln_sched::{
    Anneal, CosineAnnealingLR, CosineAnnealingWarmRestarts, CyclicLR, CyclicOptions, LinearLR,
    LrGroups, LrScheduler, MetricScheduler, OneCycleLR, OneCycleOptions, PlateauOptions,
    ReduceLROnPlateau, SchedError, SequentialLR, StepLR,
};
use serde_json::{json, Value};

/// Sets `state["state"][path...] = value` in a scheduler state dict.
fn patched(mut state: Value, path: &[&str], value: Value) -> Value {
    let mut at = &mut state["state"];
    for key in path {
        at = &mut at[*key];
    }
    *at = value;
    state
}

fn field_of(e: &SchedError) -> String {
    match e {
        SchedError::InvalidState { field, .. } => field.clone(),
        other => panic!("expected InvalidState, got {other}"),
    }
}

/// Loads `bad` into `s`, expects an error naming `field`, and checks `s` still steps as before.
fn refused_and_unchanged(s: &mut dyn LrScheduler, opt: &mut LrGroups, bad: Value, field: &str) {
    let before = s.state_dict();
    let e = s.load_state_dict(&bad).unwrap_err();
    assert_eq!(field_of(&e), field, "{e}");
    assert!(e.to_string().contains(field), "{e}");
    assert_eq!(s.state_dict(), before, "a refused load changes nothing");
    s.step(opt).unwrap();
}

#[test]
fn loaded_states_are_validated_field_by_field() {
    let mut opt = LrGroups::with_momentum(&[0.1, 0.02], 0.9);
    let mut step = StepLR::new(&mut opt, 3, 0.5).unwrap();
    let sd = step.state_dict();
    refused_and_unchanged(
        &mut step,
        &mut opt,
        patched(sd.clone(), &["step_size"], json!(0)),
        "step_size",
    );
    refused_and_unchanged(
        &mut step,
        &mut opt,
        patched(sd.clone(), &["gamma"], json!(-1.0)),
        "gamma",
    );
    let bad = patched(sd.clone(), &["core", "base_lrs"], json!([0.1, -0.5]));
    refused_and_unchanged(&mut step, &mut opt, bad, "base_lrs[1]");
    let bad = patched(sd.clone(), &["core", "base_lrs"], json!([0.1]));
    refused_and_unchanged(&mut step, &mut opt, bad, "base_lrs.len()");
    let bad = patched(sd.clone(), &["core", "last_epoch"], json!(i64::MAX));
    refused_and_unchanged(&mut step, &mut opt, bad, "last_epoch");

    let mut opt = LrGroups::with_momentum(&[0.1, 0.02], 0.9);
    let mut cos = CosineAnnealingLR::new(&mut opt, 10, 0.0).unwrap();
    let bad = patched(cos.state_dict(), &["t_max"], json!(0));
    refused_and_unchanged(&mut cos, &mut opt, bad, "t_max");

    let mut opt = LrGroups::with_momentum(&[0.1, 0.02], 0.9);
    let mut warm = CosineAnnealingWarmRestarts::new(&mut opt, 4, 2, 0.0).unwrap();
    let bad = patched(warm.state_dict(), &["t_i"], json!(0.0));
    refused_and_unchanged(&mut warm, &mut opt, bad, "t_i");

    let mut opt = LrGroups::with_momentum(&[0.1, 0.02], 0.9);
    let mut one = OneCycleLR::new(&mut opt, [0.2, 0.1], 50, OneCycleOptions::default()).unwrap();
    let bad = patched(one.state_dict(), &["max_lrs"], json!([0.2]));
    refused_and_unchanged(&mut one, &mut opt, bad, "max_lrs.len()");
    let bad = patched(one.state_dict(), &["base_momentums"], json!([0.85, "nan"]));
    // A string where a number belongs is a parse error, also typed.
    assert!(matches!(
        one.load_state_dict(&bad),
        Err(SchedError::State { .. })
    ));
    let bad = patched(one.state_dict(), &["max_momentums"], json!([0.95]));
    refused_and_unchanged(&mut one, &mut opt, bad, "max_momentums.len()");

    let mut opt = LrGroups::with_momentum(&[0.1, 0.02], 0.9);
    let mut cyc = CyclicLR::new(&mut opt, 0.01, 0.1, CyclicOptions::default()).unwrap();
    let bad = patched(cyc.state_dict(), &["step_ratio"], json!(0.0));
    refused_and_unchanged(&mut cyc, &mut opt, bad, "step_ratio");
}

/// SequentialLR milestones `[0, 0, 0]` indexed past its children.
#[test]
fn sequential_milestones_and_children_are_validated() {
    let mut opt = LrGroups::new(&[0.1]);
    let a = Box::new(LinearLR::new(&mut opt, 0.1, 1.0, 5).unwrap());
    let b = Box::new(CosineAnnealingLR::new(&mut opt, 10, 0.0).unwrap());
    let c = Box::new(StepLR::new(&mut opt, 2, 0.5).unwrap());
    let mut seq = SequentialLR::new(&mut opt, vec![a, b, c], &[5, 15]).unwrap();
    let sd = seq.state_dict();
    let e = seq
        .load_state_dict(&patched(sd.clone(), &["milestones"], json!([0, 0, 0])))
        .unwrap_err();
    assert_eq!(field_of(&e), "milestones.len()");
    let e = seq
        .load_state_dict(&patched(sd.clone(), &["milestones"], json!([5, 5])))
        .unwrap_err();
    assert_eq!(field_of(&e), "milestones");
    // A bad third child leaves the first two as they were.
    let mut bad = sd.clone();
    bad["state"]["schedulers"][0]["state"]["core"]["last_epoch"] = json!(3);
    bad["state"]["schedulers"][2]["state"]["step_size"] = json!(0);
    assert_eq!(
        field_of(&seq.load_state_dict(&bad).unwrap_err()),
        "step_size"
    );
    assert_eq!(seq.state_dict(), sd);
    for _ in 0..30 {
        seq.step(&mut opt).unwrap();
    }
}

#[test]
fn plateau_counters_and_groups_are_validated() {
    let mut opt = LrGroups::new(&[0.1, 0.2]);
    let mut p = ReduceLROnPlateau::new(&mut opt, PlateauOptions::default()).unwrap();
    let sd = p.state_dict();
    for (key, value, field) in [
        ("num_bad_epochs", json!(u64::MAX), "num_bad_epochs"),
        ("factor", json!(1.5), "factor"),
        ("min_lrs", json!([0.0]), "min_lrs.len()"),
        ("last_lr", json!([0.1]), "last_lr.len()"),
        ("threshold", json!(-1.0), "threshold"),
        ("best", json!("nan"), "best"),
    ] {
        let e = p
            .load_state_dict(&patched(sd.clone(), &[key], value))
            .unwrap_err();
        assert_eq!(field_of(&e), field, "{e}");
    }
    p.step(&mut opt, 1.0).unwrap();
}

fn adamw(lr: f64) -> kiln_optim::Adam {
    let w = Tensor::from_vec(vec![0.5f32; 3], &[3], Device::Cpu).unwrap();
    let p = Parameter::new(w).unwrap();
    AdamW::new(
        vec![ParamGroup::new(vec![("w".into(), p)]).lr(lr)],
        AdamOptions::adamw(),
    )
    .unwrap()
}

/// OneCycleLR(three_phase, linear)'s last step computes a slightly negative lr, as PyTorch
/// does. It used to panic in `optim_impl.rs`, then was refused; now LrGroups and kiln's
/// optimizers both hold it, as PyTorch's do (exact values: `tests/onecycle_end.rs`), and one
/// more step is the typed `StepsExhausted`, never a panic.
#[test]
fn a_negative_final_onecycle_lr_is_held_by_lr_groups_and_adamw_as_in_pytorch() {
    let options = OneCycleOptions {
        anneal_strategy: Anneal::Linear,
        three_phase: true,
        ..Default::default()
    };
    let total = 100;
    let mut groups = LrGroups::with_momentum(&[0.01], 0.9);
    let mut s = OneCycleLR::new(&mut groups, 0.1, total, options.clone()).unwrap();
    for _ in 0..total {
        s.step(&mut groups).unwrap();
    }
    let last = s.get_last_lr()[0];
    assert!(
        last < 0.0 && last > -1e-3,
        "PyTorch's final lr is slightly negative: {last}"
    );
    assert_eq!(groups.lrs()[0], last);

    let mut opt = adamw(0.01);
    let mut s = OneCycleLR::new(&mut opt, 0.1, total, options).unwrap();
    for _ in 0..total {
        s.step(&mut opt).unwrap();
    }
    assert_eq!(s.get_last_lr()[0], last);
    assert_eq!(
        opt.lr(0).unwrap(),
        last,
        "the optimizer holds PyTorch's value"
    );
    let (beta1, epoch) = (opt.momentum(0).unwrap(), s.last_epoch());
    let e = s.step(&mut opt).unwrap_err();
    assert!(matches!(e, SchedError::StepsExhausted { .. }), "{e}");
    assert_eq!(opt.lr(0).unwrap(), last, "the refused step is undone");
    assert_eq!(opt.momentum(0).unwrap(), beta1, "momentum too");
    assert_eq!(s.last_epoch(), epoch);
    // Its state (lr -9.7e-5) reloads into a fresh optimizer, as PyTorch's load_state_dict does.
    let mut fresh = adamw(0.01);
    fresh.load_state_dict(&opt.state_dict().unwrap()).unwrap();
    assert_eq!(fresh.lr(0).unwrap(), last);
    // A user's negative lr at construction and a non-finite one anywhere stay errors.
    assert!(opt.set_lr(0, f64::NAN).is_err() && opt.set_lr(0, f64::INFINITY).is_err());
    let w = Parameter::new(Tensor::from_vec(vec![0.5f32; 3], &[3], Device::Cpu).unwrap()).unwrap();
    let group = ParamGroup::new(vec![("w".into(), w)]).lr(-0.1);
    assert!(AdamW::new(vec![group], AdamOptions::adamw()).is_err());
}

/// A NaN max_lr reached the optimizer's initial_lr and panicked; it is now refused by name
/// before anything is written, and values the optimizer refuses are `Refused`, not a panic.
#[test]
fn nan_settings_refused_by_the_optimizer_are_errors() {
    let mut opt = adamw(0.01);
    let e = OneCycleLR::new(&mut opt, f64::NAN, 10, OneCycleOptions::default()).unwrap_err();
    assert!(
        matches!(
            e,
            SchedError::InvalidParameter {
                parameter: "max_lr",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(opt.initial_lr(0).unwrap(), None, "nothing was written");
    let mut opt = adamw(0.01);
    let o = CyclicOptions {
        base_momentum: (-0.5).into(),
        max_momentum: (-0.2).into(),
        ..Default::default()
    };
    let e = CyclicLR::new(&mut opt, 0.001, 0.01, o).unwrap_err();
    assert!(
        matches!(
            e,
            SchedError::Refused {
                what: "momentum",
                ..
            }
        ),
        "{e}"
    );
}

/// Counts beyond 2^53 wrapped in `as i64` (`usize::MAX` became -1) or overflowed `2 * T_max`.
#[test]
fn constructor_counts_beyond_2_pow_53_are_errors() {
    let mut opt = LrGroups::new(&[0.1]);
    let huge = usize::MAX;
    let msgs = [
        StepLR::new(&mut opt, huge, 0.5).unwrap_err(),
        CosineAnnealingLR::new(&mut opt, 1 << 62, 0.0).unwrap_err(),
        LinearLR::new(&mut opt, 0.5, 1.0, huge).unwrap_err(),
        OneCycleLR::new(&mut opt, 0.1, huge, OneCycleOptions::default()).unwrap_err(),
    ];
    for e in msgs {
        assert!(e.to_string().contains("2^53"), "{e}");
    }
    let mut warm = CosineAnnealingWarmRestarts::new(&mut opt, 3, 2, 0.0).unwrap();
    let e = warm.step_to(&mut opt, 1e300).unwrap_err();
    assert!(e.to_string().contains("2^53"), "{e}");
    warm.step(&mut opt).unwrap();
}

/// Valid states round-trip, including OneCycleLR with pct_start 0 (phase ends before step 0)
/// and CosineAnnealingWarmRestarts after fractional epochs.
#[test]
fn valid_edge_states_still_load() {
    let mut opt = LrGroups::with_momentum(&[0.1], 0.9);
    let o = OneCycleOptions {
        pct_start: 0.0,
        three_phase: true,
        ..Default::default()
    };
    let mut one = OneCycleLR::new(&mut opt, 0.2, 10, o).unwrap();
    one.step(&mut opt).unwrap();
    let sd = one.state_dict();
    one.load_state_dict(&sd).unwrap();
    let mut warm = CosineAnnealingWarmRestarts::new(&mut opt, 3, 2, 0.0).unwrap();
    for i in 0..40 {
        warm.step_to(&mut opt, i as f64 * 0.37).unwrap();
        let sd = warm.state_dict();
        warm.load_state_dict(&sd).unwrap();
    }
}

/// A decay that overflows wrote lr = inf (which serializes as null, so the run's own state no
/// longer loaded); a NaN or infinite per-group value or a negative cyclic lr was accepted.
/// All are errors now, found by the constructor fuzz target.
#[test]
fn non_finite_lrs_and_negative_cyclic_lrs_are_errors() {
    let mut opt = LrGroups::new(&[0.1]);
    let mut s = kiln_sched::ExponentialLR::new(&mut opt, 1e300).unwrap();
    s.step(&mut opt).unwrap(); // 1e299
    let e = s.step(&mut opt).unwrap_err();
    assert!(matches!(e, SchedError::NonFiniteLr { group: 0, .. }), "{e}");
    assert_eq!(opt.lrs()[0], 0.1 * 1e300, "the failed step is undone");
    let sd = s.state_dict();
    s.load_state_dict(&sd).unwrap();

    let mut opt = LrGroups::with_momentum(&[0.1, 0.2], 0.9);
    let e = CyclicLR::new(&mut opt, -1.0, 1.0, CyclicOptions::default()).unwrap_err();
    assert!(e.to_string().contains(">= 0"), "{e}");
    let e = OneCycleLR::new(&mut opt, [0.1, f64::NAN], 10, OneCycleOptions::default()).unwrap_err();
    assert!(e.to_string().contains("finite"), "{e}");
    let o = PlateauOptions {
        min_lr: f64::INFINITY.into(),
        ..Default::default()
    };
    assert!(ReduceLROnPlateau::new(&mut opt, o).is_err());
    let o = PlateauOptions {
        min_lr: (-1.0).into(),
        ..Default::default()
    };
    let e = ReduceLROnPlateau::new(&mut opt, o).unwrap_err();
    assert!(e.to_string().contains("min_lr"), "{e}");
    let o = PlateauOptions {
        cooldown: usize::MAX,
        ..Default::default()
    };
    assert!(ReduceLROnPlateau::new(&mut opt, o).is_err());
}
