//! GradScaler's rules at their edges, as PyTorch's `torch.amp.GradScaler` keeps them: an
//! overflow restarts the count of clean steps, a growth that would overflow f32 is skipped, a
//! backoff factor of 1 is refused, and `update` / `step` out of order are errors.

use kiln_autograd::{Device, Parameter, Tensor};
use kiln_optim::{GradScaler, GradScalerOptions, ParamGroup, Sgd, SgdOptions};

/// One parameter of two elements under plain SGD (lr 0: the tests watch the scaler only).
fn sgd() -> (Parameter, Sgd) {
    let p =
        Parameter::new(Tensor::from_vec(vec![1.0f32, 2.0], &[2], Device::Cpu).unwrap()).unwrap();
    let opt = Sgd::new(
        vec![ParamGroup::new(vec![("w".into(), p.clone())])],
        SgdOptions::default().lr(0.0),
    )
    .unwrap();
    (p, opt)
}

/// One scaled step whose gradient is `g` (already multiplied by the scale), then `update`.
fn step(scaler: &mut GradScaler, opt: &mut Sgd, p: &Parameter, g: f32) -> bool {
    p.set_grad(Some(
        Tensor::from_vec(vec![g, g], &[2], Device::Cpu).unwrap(),
    ))
    .unwrap();
    let taken = scaler.step(opt).unwrap();
    scaler.update().unwrap();
    taken
}

#[test]
fn an_overflow_restarts_the_count_of_clean_steps() {
    let (p, mut opt) = sgd();
    let mut scaler = GradScaler::new(GradScalerOptions {
        init_scale: 64.0,
        growth_interval: 3,
        ..Default::default()
    })
    .unwrap();
    // Two clean steps, then an overflow: the scale halves and the count starts again.
    assert!(step(&mut scaler, &mut opt, &p, 1.0));
    assert!(step(&mut scaler, &mut opt, &p, 1.0));
    assert_eq!(scaler.growth_tracker(), 2);
    assert!(!step(&mut scaler, &mut opt, &p, f32::INFINITY));
    assert_eq!((scaler.get_scale(), scaler.growth_tracker()), (32.0, 0));
    // So it takes three more clean steps, not one, to grow.
    for tracker in [1, 2] {
        assert!(step(&mut scaler, &mut opt, &p, 1.0));
        assert_eq!(
            (scaler.get_scale(), scaler.growth_tracker()),
            (32.0, tracker)
        );
    }
    assert!(step(&mut scaler, &mut opt, &p, 1.0));
    assert_eq!((scaler.get_scale(), scaler.growth_tracker()), (64.0, 0));
}

#[test]
fn a_growth_past_f32s_range_keeps_the_scale() {
    let (p, mut opt) = sgd();
    let top = 2f64.powi(127);
    let mut scaler = GradScaler::new(GradScalerOptions {
        init_scale: top,
        growth_interval: 1,
        ..Default::default()
    })
    .unwrap();
    // 2^127 x 2 is infinite in f32: PyTorch keeps the scale (and restarts the count).
    assert!(step(&mut scaler, &mut opt, &p, 1.0));
    assert_eq!((scaler.get_scale(), scaler.growth_tracker()), (top, 0));
    let loss = Tensor::from_vec(vec![1.0f32], &[1], Device::Cpu).unwrap();
    let scaled = scaler.scale(&loss).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(f64::from(scaled[0]), top);
}

#[test]
fn a_backoff_factor_of_one_and_calls_out_of_order_are_refused() {
    // PyTorch asserts growth_factor > 1 and backoff_factor < 1: a factor of 1 would never
    // back off, and every overflow would repeat.
    let e = GradScaler::new(GradScalerOptions {
        backoff_factor: 1.0,
        ..Default::default()
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("backoff_factor 1.0 in (0, 1)"), "{e}");
    let (p, mut opt) = sgd();
    let mut scaler = GradScaler::default();
    // update() with nothing recorded since the last one.
    let e = scaler.update().unwrap_err().to_string();
    assert!(
        e.contains("no inf checks were recorded prior to update()"),
        "{e}"
    );
    // step() twice without update() in between.
    p.set_grad(Some(
        Tensor::from_vec(vec![1.0f32, 1.0], &[2], Device::Cpu).unwrap(),
    ))
    .unwrap();
    assert!(scaler.step(&mut opt).unwrap());
    let e = scaler.step(&mut opt).unwrap_err().to_string();
    assert!(
        e.contains("step() has already been called since the last update()"),
        "{e}"
    );
    scaler.update().unwrap();
    assert!(scaler.step(&mut opt).unwrap());
}
