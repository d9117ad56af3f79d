//! Hostile calls of every kiln-losses function, checked against the f64 reference in
//! [`crate::loss_reference`]. Each case draws a loss, its options (ignore_index, label
//! smoothing, beta, delta, num_classes; in and out of range, NaN, infinities), a reduction, an
//! input shape (an empty batch, an empty class dim, spatial dims), values (sometimes NaN,
//! infinities, 0 or huge; cross-entropy logits sometimes all moved by 1e17 or more), targets
//! in the right form or in one of the usual mix-ups (one-hot for indices, floats for indices,
//! bools, another shape or dtype; labels out of range or equal to ignore_index), and class
//! weights or BCE weights of the right or a wrong shape.
//!
//! The check: where the reference refuses, kiln must return an error; otherwise kiln's shape,
//! dtype and values must equal the reference's (NaN where it is NaN, the same infinity where it
//! is infinite, else within f64 1e-9 / f32 2e-5 of the operands' scale). When the input (and a
//! float target) needs a gradient, backward must succeed, and for the smooth losses with
//! moderate f64 operands the gradients must equal the reference's central differences.

use crate::harness::{refused, run, Outcome, Rng};
use crate::loss_reference::{expected, Expected, Kind, Loss, LossCase, Operand, Reduce};
use kiln::autograd::{DType, Device, Tensor};
use kiln::losses::{self as l, BceOptions, BceWithLogitsOptions, CrossEntropyOptions};
use kiln::losses::{KlDivReduction, NllLossOptions, Reduction};

const IGNORE_INDICES: [i64; 6] = [-100, 0, 1, -1, i64::MIN, 1 << 62];

fn other_float(kind: Kind) -> Kind {
    if kind == Kind::F32 {
        Kind::F64
    } else {
        Kind::F32
    }
}

/// A float of `kind`: usually in `lo..hi`, sometimes hostile (huge ones only for f64, whose
/// reference cannot overflow where kiln's f32 arithmetic would).
fn float(rng: &mut Rng, kind: Kind, lo: f64, hi: f64) -> f64 {
    let v = if rng.chance(0.08) {
        let mut hostile = vec![
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            0.0,
            1.0,
            -1.0,
            1.5,
        ];
        if kind == Kind::F64 {
            hostile.extend([1e300, -1e300, 1e-300, f64::MAX]);
        }
        rng.pick(&hostile)
    } else {
        lo + (hi - lo) * rng.below(1 << 20) as f64 / (1 << 20) as f64
    };
    if kind == Kind::F32 {
        v as f32 as f64
    } else {
        v
    }
}

fn floats(rng: &mut Rng, shape: &[usize], kind: Kind, lo: f64, hi: f64) -> Operand {
    let n = shape.iter().product();
    Operand {
        shape: shape.to_vec(),
        kind,
        values: (0..n).map(|_| float(rng, kind, lo, hi)).collect(),
    }
}

/// Class labels for `classes` classes: mostly valid, sometimes `ignore`, sometimes out of range.
fn labels(rng: &mut Rng, shape: &[usize], kind: Kind, classes: usize, ignore: i64) -> Operand {
    let n = shape.iter().product();
    let mut label = || -> f64 {
        let v = match rng.below(20) {
            0 | 1 => ignore as f64,
            2 => rng.pick(&[classes as f64, -1.0, i64::MIN as f64, (1i64 << 62) as f64]),
            _ if classes == 0 => 0.0,
            _ => rng.below(classes) as f64,
        };
        if kind == Kind::U8 && !(0.0..256.0).contains(&v) {
            255.0
        } else {
            v
        }
    };
    let values = (0..n).map(|_| label()).collect();
    Operand {
        shape: shape.to_vec(),
        kind,
        values,
    }
}

fn sizes(rng: &mut Rng, rank: usize, max: usize) -> Vec<usize> {
    (0..rank)
        .map(|_| {
            if rng.chance(0.05) {
                0
            } else {
                1 + rng.below(max)
            }
        })
        .collect()
}

/// A shape that is not `shape`.
fn other_shape(rng: &mut Rng, shape: &[usize]) -> Vec<usize> {
    let mut s = shape.to_vec();
    match (rng.below(3), s.is_empty()) {
        (0, _) | (_, true) => s.push(1 + rng.below(3)),
        (1, false) => {
            s.pop();
        }
        _ => {
            let i = rng.below(s.len());
            s[i] += 1;
        }
    }
    s
}

fn class_case(rng: &mut Rng, loss: Loss, kind: Kind) -> LossCase {
    let c = if rng.chance(0.05) {
        0
    } else {
        1 + rng.below(5)
    };
    let mut shape = vec![c];
    if rng.chance(0.85) {
        shape.insert(0, if rng.chance(0.1) { 0 } else { 1 + rng.below(3) });
        let spatial = rng.below(3);
        shape.extend(sizes(rng, spatial, 3));
    }
    let mut positions = shape.clone();
    positions.remove(if shape.len() == 1 { 0 } else { 1 });
    let ignore = match loss {
        Loss::CrossEntropy { ignore_index, .. } | Loss::Nll { ignore_index } => ignore_index,
        _ => -100,
    };
    let probabilities = matches!(loss, Loss::CrossEntropy { .. }) && rng.chance(0.25);
    let target = match rng.below(10) {
        0 => {
            let (s, k) = match rng.below(5) {
                0 => (shape.clone(), Kind::I64),
                1 => (positions.clone(), kind),
                2 => (positions.clone(), Kind::Bool),
                3 => (other_shape(rng, &positions), Kind::I64),
                _ => (shape.clone(), other_float(kind)),
            };
            floats(rng, &s, k, 0.0, 2.0)
        }
        _ if probabilities => floats(rng, &shape, kind, 0.0, 1.0),
        1 => labels(rng, &positions, Kind::U8, c, ignore),
        _ => labels(rng, &positions, Kind::I64, c, ignore),
    };
    let weight = rng.chance(0.4).then(|| match rng.below(6) {
        0 => floats(rng, &[c + 1], kind, 0.1, 2.0),
        1 => floats(rng, &[c], other_float(kind), 0.1, 2.0),
        _ => floats(rng, &[c], kind, 0.1, 2.0),
    });
    let mut input = floats(rng, &shape, kind, -4.0, 4.0);
    if matches!(loss, Loss::CrossEntropy { .. }) && input.kind.is_float() && rng.chance(0.1) {
        shift_far(rng, &mut input);
    }
    LossCase {
        loss,
        reduce: rng.pick(&[Reduce::None, Reduce::Mean, Reduce::Sum]),
        input,
        target,
        weight,
        pos_weight: None,
        grad: rng.chance(0.5),
    }
}

/// Moves every finite logit by one huge offset (1e17 and beyond, where a row's values round to
/// a few neighbours and `max + ln(sum)` rounds back to `max`): the losses stay of order 1, so
/// a kernel that loses `ln(sum)` beside the maximum gives visibly wrong values.
fn shift_far(rng: &mut Rng, input: &mut Operand) {
    let offset = match input.kind {
        Kind::F64 => rng.pick(&[1e17, -1e17, 1e200]),
        _ => rng.pick(&[1e17, -1e17, 1e30]),
    };
    for v in input.values.iter_mut().filter(|v| v.is_finite()) {
        *v += offset;
        if input.kind == Kind::F32 {
            *v = *v as f32 as f64;
        }
    }
}

/// A BCE weight: a broadcastable shape (a suffix of the input's, dims sometimes 1), or not.
fn bce_weight(rng: &mut Rng, shape: &[usize], kind: Kind) -> Operand {
    let mut s: Vec<usize> = shape[rng.below(shape.len() + 1)..].to_vec();
    for d in s.iter_mut() {
        if rng.chance(0.4) {
            *d = 1;
        }
    }
    if rng.chance(0.15) {
        s = other_shape(rng, &s);
    }
    let k = if rng.chance(0.2) {
        other_float(kind)
    } else {
        kind
    };
    floats(rng, &s, k, 0.0, 3.0)
}

fn elementwise_case(rng: &mut Rng, loss: Loss, kind: Kind) -> LossCase {
    let rank = rng.below(4);
    let shape = sizes(rng, rank, 4);
    let (lo, hi) = match loss {
        Loss::Bce => (0.0, 1.0),
        Loss::KlDiv { .. } => (-4.0, 0.0),
        _ => (-4.0, 4.0),
    };
    let (tlo, thi) = match loss {
        Loss::Bce | Loss::BceWithLogits => (0.0, 1.0),
        Loss::KlDiv { log_target: false } => (0.0, 1.0),
        Loss::KlDiv { log_target: true } => (-4.0, 0.0),
        _ => (-4.0, 4.0),
    };
    let target = match rng.below(12) {
        0 => floats(rng, &shape, other_float(kind), tlo, thi),
        1 => {
            let s = other_shape(rng, &shape);
            floats(rng, &s, kind, tlo, thi)
        }
        2 if shape.len() >= 2 => {
            let mut positions = shape.clone();
            positions.remove(1);
            labels(rng, &positions, Kind::I64, shape[1], -100)
        }
        3 => floats(rng, &shape, Kind::Bool, 0.0, 1.0),
        _ => floats(rng, &shape, kind, tlo, thi),
    };
    let logits = loss == Loss::BceWithLogits;
    let bce = logits || loss == Loss::Bce;
    let reduce = match loss {
        Loss::KlDiv { .. } => {
            rng.pick(&[Reduce::None, Reduce::Mean, Reduce::Sum, Reduce::BatchMean])
        }
        _ => rng.pick(&[Reduce::None, Reduce::Mean, Reduce::Sum]),
    };
    LossCase {
        loss,
        reduce,
        input: floats(rng, &shape, kind, lo, hi),
        target,
        weight: (bce && rng.chance(0.3)).then(|| bce_weight(rng, &shape, kind)),
        pos_weight: (logits && rng.chance(0.3)).then(|| bce_weight(rng, &shape, kind)),
        grad: rng.chance(0.5),
    }
}

/// Labels and a class count for `one_hot`: counts small or far past any memory, never between
/// (so whether the output fits does not depend on the machine).
fn one_hot_case(rng: &mut Rng) -> LossCase {
    let rank = rng.below(4);
    let shape = sizes(rng, rank, 4);
    let huge = [1usize << 40, usize::MAX, 1 << 62];
    let classes = match rng.below(8) {
        0 => None,
        1 => Some(rng.pick(&huge)),
        _ => Some(rng.below(9)),
    };
    let kind = rng.pick(&[Kind::I64, Kind::I64, Kind::U8, Kind::F32]);
    let n = shape.iter().product();
    let values = (0..n)
        .map(|_| match rng.below(30) {
            0 if kind != Kind::U8 => -1.0,
            1 if kind == Kind::I64 => (1i64 << 41) as f64,
            _ => rng.below(8) as f64,
        })
        .collect();
    LossCase {
        loss: Loss::OneHot { classes },
        reduce: Reduce::None,
        input: Operand {
            shape: vec![0],
            kind: Kind::F32,
            values: vec![],
        },
        target: Operand {
            shape,
            kind,
            values,
        },
        weight: None,
        pos_weight: None,
        grad: false,
    }
}

fn generate(rng: &mut Rng) -> LossCase {
    let kind = if rng.chance(0.6) {
        Kind::F64
    } else {
        Kind::F32
    };
    let param = |rng: &mut Rng, usual: &[f64]| {
        let hostile = [-1.0, 0.0, f64::NAN, f64::INFINITY, 1e-300, 1e300, -0.0];
        if rng.chance(0.2) {
            rng.pick(&hostile)
        } else {
            rng.pick(usual)
        }
    };
    match rng.below(11) {
        0 | 1 => {
            let smoothing = param(rng, &[0.0, 0.0, 0.1, 0.5, 1.0, 0.999]);
            let ignore_index = rng.pick(&IGNORE_INDICES);
            class_case(
                rng,
                Loss::CrossEntropy {
                    ignore_index,
                    smoothing,
                },
                kind,
            )
        }
        2 => {
            let ignore_index = rng.pick(&IGNORE_INDICES);
            class_case(rng, Loss::Nll { ignore_index }, kind)
        }
        3 => elementwise_case(rng, Loss::Bce, kind),
        4 => elementwise_case(rng, Loss::BceWithLogits, kind),
        5 => elementwise_case(rng, Loss::Mse, kind),
        6 => elementwise_case(rng, Loss::L1, kind),
        7 => {
            let beta = param(rng, &[1.0, 0.5, 2.0, 0.0]);
            elementwise_case(rng, Loss::SmoothL1 { beta }, kind)
        }
        8 => {
            let delta = param(rng, &[1.0, 0.5, 2.0]);
            elementwise_case(rng, Loss::Huber { delta }, kind)
        }
        9 => {
            let log_target = rng.chance(0.5);
            elementwise_case(rng, Loss::KlDiv { log_target }, kind)
        }
        _ => one_hot_case(rng),
    }
}

fn tensor(op: &Operand) -> Tensor {
    let (v, s, cpu) = (&op.values, &op.shape[..], Device::Cpu);
    match op.kind {
        Kind::F64 => Tensor::from_vec(v.clone(), s, cpu),
        Kind::F32 => Tensor::from_vec(v.iter().map(|&x| x as f32).collect::<Vec<_>>(), s, cpu),
        Kind::I64 => Tensor::from_vec(v.iter().map(|&x| x as i64).collect::<Vec<_>>(), s, cpu),
        Kind::U8 => Tensor::from_vec(v.iter().map(|&x| x as u8).collect::<Vec<_>>(), s, cpu),
        Kind::Bool => Tensor::from_vec(v.clone(), s, cpu).and_then(|t| t.gt_scalar(0.5)),
    }
    .expect("a small tensor")
}

/// Runs the case's loss on `input` and `target` as kiln tensors.
fn call(case: &LossCase, input: &Tensor, target: &Tensor) -> l::Result<Tensor> {
    let weight = case.weight.as_ref().map(tensor);
    let pos_weight = case.pos_weight.as_ref().map(tensor);
    let reduction = match case.reduce {
        Reduce::None => Reduction::None,
        Reduce::Sum => Reduction::Sum,
        Reduce::Mean | Reduce::BatchMean => Reduction::Mean,
    };
    let kl_reduction = match case.reduce {
        Reduce::None => KlDivReduction::None,
        Reduce::Sum => KlDivReduction::Sum,
        Reduce::Mean => KlDivReduction::Mean,
        Reduce::BatchMean => KlDivReduction::BatchMean,
    };
    let weight = weight.as_ref();
    match case.loss {
        Loss::CrossEntropy {
            ignore_index,
            smoothing,
        } => l::cross_entropy(
            input,
            target,
            &CrossEntropyOptions {
                weight,
                ignore_index,
                reduction,
                label_smoothing: smoothing,
            },
        ),
        Loss::Nll { ignore_index } => l::nll_loss(
            input,
            target,
            &NllLossOptions {
                weight,
                ignore_index,
                reduction,
            },
        ),
        Loss::Bce => l::binary_cross_entropy(input, target, &BceOptions { weight, reduction }),
        Loss::BceWithLogits => {
            let pos_weight = pos_weight.as_ref();
            let options = BceWithLogitsOptions {
                weight,
                pos_weight,
                reduction,
            };
            l::binary_cross_entropy_with_logits(input, target, &options)
        }
        Loss::Mse => l::mse_loss(input, target, reduction),
        Loss::L1 => l::l1_loss(input, target, reduction),
        Loss::SmoothL1 { beta } => l::smooth_l1_loss(input, target, reduction, beta),
        Loss::Huber { delta } => l::huber_loss(input, target, reduction, delta),
        Loss::KlDiv { log_target } => l::kl_div(input, target, kl_reduction, log_target),
        Loss::OneHot { classes } => l::one_hot(target, classes),
    }
}

/// The scale of the value tolerance. For cross-entropy, the largest class weight and
/// probability target times the spread of the logits (each at least 1), which bound its terms
/// `q w (lse - z)` whatever the logits' magnitude: a kernel that loses `ln(sum)` beside logits
/// beyond 1e16 fails it. For the others, the largest finite magnitude among the case's float
/// operands (at least 1), squared for the losses that square.
fn scale(case: &LossCase) -> f64 {
    // The largest finite magnitude among `ops`' float values, at least 1.
    let largest = |ops: &[Option<&Operand>]| {
        let floats = ops.iter().flatten().filter(|o| o.kind.is_float());
        let finite = floats
            .flat_map(|o| o.values.iter())
            .filter(|v| v.is_finite());
        finite.fold(1.0f64, |m, v| m.max(v.abs()))
    };
    if matches!(case.loss, Loss::CrossEntropy { .. }) {
        let logits = case.input.values.iter().filter(|v| v.is_finite());
        let (lo, hi) = logits.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        });
        let spread = (hi - lo).max(1.0);
        return largest(&[case.weight.as_ref()]) * largest(&[Some(&case.target)]) * spread;
    }
    let m = largest(&[
        Some(&case.input),
        Some(&case.target),
        case.weight.as_ref(),
        case.pos_weight.as_ref(),
    ]);
    m * m
}

/// Where the reference is NaN or infinite, kiln must not be finite: operands this hostile
/// (infinite logits or weights, logits near f64's limit) leave no number to compare, and
/// kiln's fused kernels may give an infinity where PyTorch's step by step gives NaN, or the
/// reverse. A finite answer there, or a wrong finite one elsewhere, fails.
fn same(got: f64, want: f64, tol: f64) -> bool {
    if !want.is_finite() {
        return !got.is_finite();
    }
    (got - want).abs() <= tol
}

/// Gradients are compared with central differences where the loss is smooth and every operand
/// moderate (f64, finite, |v| <= 8; positive KL targets).
fn differentiable(case: &LossCase, want: &[f64]) -> bool {
    let smooth = matches!(
        case.loss,
        Loss::CrossEntropy { .. } | Loss::Nll { .. } | Loss::BceWithLogits | Loss::Mse
    ) || matches!(case.loss, Loss::KlDiv { .. });
    let moderate = |o: &Operand| o.values.iter().all(|v| v.abs() <= 8.0);
    let ops = [Some(&case.input), Some(&case.target), case.weight.as_ref()];
    let kl_positive = case.loss != (Loss::KlDiv { log_target: false })
        || case.target.values.iter().all(|&t| t > 1e-3);
    smooth
        && kl_positive
        && case.input.kind == Kind::F64
        && ops
            .into_iter()
            .chain([case.pos_weight.as_ref()])
            .flatten()
            .all(moderate)
        && want.iter().all(|v| v.is_finite())
}

/// The reference's d(sum of outputs)/d(operand element), by central differences.
fn central_differences(case: &LossCase, of_target: bool) -> Vec<f64> {
    let h = 1e-6;
    let sum_at = |k: usize, delta: f64| {
        let mut c = case.clone();
        let op = if of_target {
            &mut c.target
        } else {
            &mut c.input
        };
        op.values[k] += delta;
        match expected(&c) {
            Expected::Value { values, .. } => values.iter().sum::<f64>(),
            Expected::Refused => f64::NAN,
        }
    };
    let n = if of_target { &case.target } else { &case.input }
        .values
        .len();
    (0..n)
        .map(|k| (sum_at(k, h) - sum_at(k, -h)) / (2.0 * h))
        .collect()
}

fn check(case: &LossCase) -> Outcome {
    let want = expected(case);
    let input = tensor(&case.input);
    let target = tensor(&case.target);
    let grad_input = case.grad && !matches!(case.loss, Loss::OneHot { .. });
    let grad_target = grad_input && case.target.kind == case.input.kind;
    let input = input.set_requires_grad(grad_input).unwrap();
    let target = target.set_requires_grad(grad_target).unwrap();
    let got = call(case, &input, &target);
    let values = match (want, got) {
        (Expected::Refused, Err(e)) => return refused(e),
        (Expected::Refused, Ok(t)) => panic!("the reference refuses; kiln gave {:?}", t.shape()),
        (Expected::Value { shape, .. }, Err(e)) => {
            panic!("kiln refused a valid call (reference shape {shape:?}): {e}")
        }
        (Expected::Value { shape, values }, Ok(t)) => {
            assert_eq!(t.shape(), &shape[..], "shape");
            let dtype = match (case.loss, case.input.kind) {
                (Loss::OneHot { .. }, _) => DType::I64,
                (_, Kind::F32) => DType::F32,
                _ => DType::F64,
            };
            assert_eq!(t.dtype(), dtype, "dtype");
            let tol = if dtype == DType::F32 { 2e-5 } else { 1e-9 } * scale(case);
            let got = t.to_vec_f64().unwrap();
            for (i, (&g, &w)) in got.iter().zip(&values).enumerate() {
                let ok = same(g, w, tol * w.abs().max(1.0));
                assert!(ok, "element {i}: kiln {g}, reference {w}");
            }
            if grad_input {
                t.sum_all()
                    .and_then(|s| s.backward())
                    .expect("backward of a valid loss");
            }
            values
        }
    };
    if grad_input && differentiable(case, &values) {
        let operands = [(&input, false), (&target, true)];
        for (tensor, of_target) in operands.into_iter().take(if grad_target { 2 } else { 1 }) {
            if of_target && matches!(case.loss, Loss::Nll { .. }) {
                continue;
            }
            let got = tensor.grad().expect("a gradient").to_vec_f64().unwrap();
            let fd = central_differences(case, of_target);
            for (k, (&g, &f)) in got.iter().zip(&fd).enumerate() {
                let which = if of_target { "target" } else { "input" };
                assert!(
                    (g - f).abs() <= 2e-5 * (1.0 + f.abs()),
                    "d/d{which}[{k}]: kiln {g}, differences {f}"
                );
            }
        }
    }
    Outcome::Accepted
}

/// The loss fuzz target.
pub fn loss_calls(seed: u64, cases: usize) {
    run("losses vs an f64 reference", seed, cases, generate, check);
}
