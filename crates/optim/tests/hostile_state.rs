//! Hostile state dicts: a negative second moment, a NaN moment, a value count that does not
//! fit the shape, a shape whose element count overflows or a step count the next step would
//! overflow is refused by `load_state_dict`, naming the parameter and the field, and the
//! optimizer keeps the state it had.

use kiln_autograd::{Device, Parameter, Tensor};
use kiln_optim::{AdamOptions, AdamW, Optimizer, ParamGroup, StateDict};

fn stepped() -> (impl Optimizer, StateDict) {
    let p =
        Parameter::new(Tensor::from_vec(vec![0.5f32, -1.0], &[2], Device::Cpu).unwrap()).unwrap();
    p.set_grad(Some(
        Tensor::from_vec(vec![0.1f32, 0.2], &[2], Device::Cpu).unwrap(),
    ))
    .unwrap();
    let opts = AdamOptions::adamw().amsgrad(true).lr(0.01);
    let mut opt = AdamW::new(vec![ParamGroup::new(vec![("w".into(), p)])], opts).unwrap();
    opt.step().unwrap();
    let sd = opt.state_dict().unwrap();
    (opt, sd)
}

fn edited(field: &str, edit: impl Fn(&mut Vec<f64>)) -> StateDict {
    let (_, mut sd) = stepped();
    let rec = sd.state[0].as_mut().unwrap();
    edit(&mut rec.buffers.get_mut(field).unwrap().data);
    sd
}

fn reshaped(field: &str, shape: &[usize]) -> StateDict {
    let (_, mut sd) = stepped();
    let rec = sd.state[0].as_mut().unwrap();
    rec.buffers.get_mut(field).unwrap().shape = shape.to_vec();
    sd
}

#[test]
fn bad_moments_are_refused_naming_the_parameter_and_field() {
    let cases = [
        (
            "exp_avg_sq",
            edited("exp_avg_sq", |d| d[1] = -1.0),
            "never negative",
        ),
        (
            "max_exp_avg_sq",
            edited("max_exp_avg_sq", |d| d[0] = -0.5),
            "never negative",
        ),
        (
            "exp_avg",
            edited("exp_avg", |d| d[0] = f64::NAN),
            "non-finite",
        ),
        (
            "exp_avg_sq",
            edited("exp_avg_sq", |d| d[0] = f64::INFINITY),
            "non-finite",
        ),
        (
            "exp_avg",
            edited("exp_avg", |d| d.truncate(1)),
            "needs 2 values but 1",
        ),
        // A shape whose element count overflows `usize` (found by the checkpoint fuzz suite:
        // a debug-build panic computing the count).
        (
            "exp_avg",
            reshaped("exp_avg", &[2, usize::MAX, 2]),
            "overflows",
        ),
    ];
    for (field, sd, why) in cases {
        let (mut opt, good) = stepped();
        let err = opt.load_state_dict(&sd).unwrap_err().to_string();
        assert!(err.contains(&format!("parameter `w`: {field}:")), "{err}");
        assert!(err.contains(why), "{err}");
        assert_eq!(
            opt.state_dict().unwrap(),
            good,
            "a refused load changed the state"
        );
    }
    // A step count that the next step would overflow (found by the checkpoint fuzz suite: a
    // debug-build panic in the step, and in release a count wrapped to 0, whose bias
    // correction divides by zero).
    let (mut opt, good) = stepped();
    let mut sd = good.clone();
    sd.state[0].as_mut().unwrap().step = u64::MAX;
    let err = opt.load_state_dict(&sd).unwrap_err().to_string();
    assert!(
        err.contains("parameter `w`: step count") && err.contains("past 2^53"),
        "{err}"
    );
    assert_eq!(
        opt.state_dict().unwrap(),
        good,
        "a refused load changed the state"
    );
    sd.state[0].as_mut().unwrap().step = 1 << 53;
    opt.load_state_dict(&sd).unwrap();
    opt.step().unwrap();
    let (mut opt, good) = stepped();
    opt.load_state_dict(&good).unwrap();
}

/// Issue 18 fuzz finds: a growth tracker at or past its interval (u64::MAX overflowed in
/// `update`, a debug-build panic) is refused on load, naming both fields; an init_scale beyond
/// f32's range (which the f32 scale would hold as inf) is refused at construction.
#[test]
fn grad_scaler_refuses_a_tracker_past_its_interval_and_an_unrepresentable_scale() {
    use kiln_optim::{GradScaler, GradScalerOptions};
    let mut scaler = GradScaler::new(GradScalerOptions::default()).unwrap();
    let good = scaler.state_dict();
    for tracker in [good.growth_interval, u64::MAX] {
        let bad = kiln_optim::GradScalerState {
            growth_tracker: tracker,
            ..good.clone()
        };
        let e = scaler.load_state_dict(&bad).unwrap_err().to_string();
        assert!(
            e.contains(&format!(
                "growth_tracker {tracker} must be below growth_interval 2000"
            )),
            "{e}"
        );
        assert_eq!(scaler.state_dict(), good, "a refused load changes nothing");
    }
    for init_scale in [1e39, 1e-50] {
        let e = GradScaler::new(GradScalerOptions {
            init_scale,
            ..GradScalerOptions::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("within f32's range"), "{e}");
    }
}
