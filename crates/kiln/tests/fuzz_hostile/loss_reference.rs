//! An f64 reference for the loss fuzz target: each kiln-losses function written out from
//! PyTorch 2.15's formulas, position by position, and the calls PyTorch (or kiln, where it is
//! deliberately stricter) refuses.
//!
//! Invariants: a `LossCase` holds every operand as f64 values already rounded to its dtype, so
//! the reference and kiln see the same numbers; [`expected`] returns [`Expected::Refused`]
//! exactly where the call must fail, [`Expected::Value`] with PyTorch's shape and values
//! otherwise. Where kiln differs from PyTorch on purpose, the difference is written here with
//! the reason:
//! - elementwise losses need a target of the input's shape and dtype (PyTorch broadcasts with a
//!   warning);
//! - `smooth_l1_loss` refuses an infinite `beta`, `huber_loss` an infinite `delta`;
//! - class-index targets may be `U8` as well as `I64`;
//! - `cross_entropy` and `nll_loss` refuse an input with no classes (PyTorch returns 0 when every
//!   target is ignored);
//! - in `cross_entropy`, a class whose coefficient `q_c · w_c` is 0 adds nothing, even where
//!   its log-probability is -inf (a masked logit): PyTorch multiplies and returns NaN. (A class
//!   with `q_c = 0` has coefficient 0 whatever its weight, in both.)

use crate::numeric::round_to;
use crate::reference::broadcast_shape;

/// A loss and its own options.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Loss {
    CrossEntropy { ignore_index: i64, smoothing: f64 },
    Nll { ignore_index: i64 },
    Bce,
    BceWithLogits,
    Mse,
    L1,
    SmoothL1 { beta: f64 },
    Huber { delta: f64 },
    KlDiv { log_target: bool },
    OneHot { classes: Option<usize> },
}

/// How per-position losses are reduced; `BatchMean` only for `kl_div`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduce {
    None,
    Mean,
    Sum,
    BatchMean,
}

/// The element type of an operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    F32,
    F64,
    I64,
    U8,
    Bool,
}

impl Kind {
    pub fn is_float(self) -> bool {
        matches!(self, Kind::F32 | Kind::F64)
    }
    fn is_index(self) -> bool {
        matches!(self, Kind::I64 | Kind::U8)
    }
}

/// One operand: its shape, element type and values (integers exact in f64: the generator keeps
/// them within 2^53, or uses i64's extremes, which compare as out of range either way).
#[derive(Debug, Clone)]
pub struct Operand {
    pub shape: Vec<usize>,
    pub kind: Kind,
    pub values: Vec<f64>,
}

/// One generated call.
#[derive(Debug, Clone)]
pub struct LossCase {
    pub loss: Loss,
    pub reduce: Reduce,
    pub input: Operand,
    pub target: Operand,
    pub weight: Option<Operand>,
    pub pos_weight: Option<Operand>,
    /// The input (and a float target of its dtype) needs a gradient: backward runs too.
    pub grad: bool,
}

/// What a call must give.
#[derive(Debug, Clone, PartialEq)]
pub enum Expected {
    Refused,
    Value { shape: Vec<usize>, values: Vec<f64> },
}

fn value(shape: Vec<usize>, values: Vec<f64>) -> Expected {
    Expected::Value { shape, values }
}

/// The reduction of per-position `losses` (shaped `shape`) whose mean divides by `denominator`.
fn reduce(r: Reduce, shape: Vec<usize>, losses: Vec<f64>, denominator: f64) -> Expected {
    let sum: f64 = losses.iter().sum();
    match r {
        Reduce::None => value(shape, losses),
        Reduce::Sum => value(vec![], vec![sum]),
        Reduce::Mean => value(vec![], vec![sum / denominator]),
        Reduce::BatchMean => value(vec![], vec![sum / shape.first().map_or(1, |&n| n) as f64]),
    }
}

/// `[N, C, D]` of a class loss's input (`[C]` is one position), and the per-position shape.
fn class_geometry(shape: &[usize]) -> ((usize, usize, usize), Vec<usize>) {
    if shape.len() == 1 {
        return ((1, shape[0], 1), vec![]);
    }
    let d = shape[2..].iter().product();
    let mut positions = shape.to_vec();
    positions.remove(1);
    ((shape[0], shape[1], d), positions)
}

/// `None` for a class loss's input without a class dim or with an empty one.
fn class_geometry_or_none(shape: &[usize]) -> Option<()> {
    let classes = *shape.get(usize::from(shape.len() > 1))?;
    (classes > 0).then_some(())
}

/// Where a class loss's targets are indices: their values, else `None` (refused), after the
/// form checks every class loss shares.
fn index_targets(case: &LossCase, positions: &[usize]) -> Option<Vec<f64>> {
    let t = &case.target;
    (t.kind.is_index() && t.shape == positions).then(|| t.values.clone())
}

/// Whether every label is `ignore` or a class in `[0, classes)`.
fn labels_valid(labels: &[f64], ignore: i64, classes: usize) -> bool {
    let valid = |y: f64| y == ignore as f64 || (y >= 0.0 && y < classes as f64);
    labels.iter().all(|&y| valid(y))
}

/// The class of a position's label, its weight added to the mean's denominator; `None` for an
/// ignored position (loss 0, nothing added), PyTorch's rule for both class-index losses.
fn kept_label(label: f64, ignore: i64, w: &[f64], denominator: &mut f64) -> Option<usize> {
    if label == ignore as f64 {
        return None;
    }
    *denominator += w[label as usize];
    Some(label as usize)
}

/// Class weights `[C]` of the input's kind, or all ones; `None` when the weight is refused.
fn class_weights(case: &LossCase, classes: usize) -> Option<Vec<f64>> {
    match &case.weight {
        None => Some(vec![1.0; classes]),
        Some(w) if w.shape == [classes] && w.kind == case.input.kind => Some(w.values.clone()),
        Some(_) => None,
    }
}

/// Half of `log_softmax` of one position's logits, max-shifted as PyTorch computes it
/// (`(v - max) - ln(sum)`, never `v - (max + ln(sum))`, where `ln(sum)` would round away beside a
/// max beyond 1e16), with every difference taken at half scale so that logits at f64's limits
/// (`-1e300` beside `f64::MAX`) do not overflow where the loss itself is finite.
fn half_log_softmax(z: &[f64]) -> Vec<f64> {
    let max = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let max = if z.iter().any(|v| v.is_nan()) {
        f64::NAN
    } else {
        max
    };
    let log_sum = z.iter().map(|&v| (v - max).exp()).sum::<f64>().ln();
    z.iter()
        .map(|&v| (v / 2.0 - max / 2.0) - log_sum / 2.0)
        .collect()
}

fn cross_entropy(case: &LossCase, ignore: i64, eps: f64) -> Expected {
    let x = &case.input;
    let ((n, c, d), positions) = class_geometry(&x.shape);
    if !(0.0..=1.0).contains(&eps) {
        return Expected::Refused;
    }
    let Some(w) = class_weights(case, c) else {
        return Expected::Refused;
    };
    let probabilities = case.target.kind == x.kind && case.target.shape == x.shape;
    let labels = index_targets(case, &positions);
    if labels.is_none() && !probabilities {
        return Expected::Refused;
    }
    if labels.as_ref().is_some_and(|l| !labels_valid(l, ignore, c)) {
        return Expected::Refused;
    }
    let at = |i: usize, k: usize, j: usize| i * c * d + k * d + j;
    let (mut losses, mut denominator) = (Vec::with_capacity(n * d), 0.0);
    for i in 0..n {
        for j in 0..d {
            let z: Vec<f64> = (0..c).map(|k| x.values[at(i, k, j)]).collect();
            let half_lp = half_log_softmax(&z);
            // A NaN logit makes the whole row NaN, even a class with coefficient 0 (in kiln its
            // log-sum-exp is NaN, in PyTorch every log-probability).
            let nan_row = z.iter().any(|v| v.is_nan());
            // The term of a class with target share q and weight w (see the module docs).
            let term = |q: f64, w: f64, lp: f64| {
                let coef = if q == 0.0 { 0.0 } else { q * w };
                if coef == 0.0 {
                    0.0
                } else {
                    -coef * lp
                }
            };
            let loss = match &labels {
                Some(l) => {
                    let Some(y) = kept_label(l[i * d + j], ignore, &w, &mut denominator) else {
                        losses.push(0.0);
                        continue;
                    };
                    let smoothing: f64 =
                        (0..c).map(|k| term(eps / c as f64, w[k], half_lp[k])).sum();
                    term(1.0 - eps, w[y], half_lp[y]) + smoothing
                }
                None => {
                    denominator += 1.0;
                    let q =
                        |k: usize| (1.0 - eps) * case.target.values[at(i, k, j)] + eps / c as f64;
                    (0..c).map(|k| term(q(k), w[k], half_lp[k])).sum()
                }
            };
            // The sum of half terms, doubled once: it overflows only where the loss does.
            losses.push(if nan_row { f64::NAN } else { 2.0 * loss });
        }
    }
    reduce(case.reduce, positions, losses, denominator)
}

fn nll(case: &LossCase, ignore: i64) -> Expected {
    let x = &case.input;
    let ((n, c, d), positions) = class_geometry(&x.shape);
    let (Some(labels), Some(w)) = (index_targets(case, &positions), class_weights(case, c)) else {
        return Expected::Refused;
    };
    if !labels_valid(&labels, ignore, c) {
        return Expected::Refused;
    }
    let (mut losses, mut denominator) = (Vec::with_capacity(n * d), 0.0);
    for i in 0..n {
        for j in 0..d {
            let Some(y) = kept_label(labels[i * d + j], ignore, &w, &mut denominator) else {
                losses.push(0.0);
                continue;
            };
            losses.push(-w[y] * x.values[i * c * d + y * d + j]);
        }
    }
    reduce(case.reduce, positions, losses, denominator)
}

/// A BCE weight or pos_weight broadcast to the input's shape and read in the input's dtype
/// (an f64 weight of an f32 input is rounded to f32, 1e308 to inf, as kiln and PyTorch compute
/// in f32), or `None` when it does not broadcast to exactly that shape.
fn broadcast_to(w: &Operand, input: &Operand) -> Option<Vec<f64>> {
    let shape = &input.shape[..];
    if broadcast_shape(&w.shape, shape)? != shape || !w.kind.is_float() {
        return None;
    }
    let n: usize = shape.iter().product();
    let offset = shape.len() - w.shape.len();
    let mut out = Vec::with_capacity(n);
    for flat in 0..n {
        let (mut rest, mut src, mut stride) = (flat, 0, 1);
        for dim in (0..shape.len()).rev() {
            let i = rest % shape[dim];
            rest /= shape[dim];
            if dim >= offset {
                let size = w.shape[dim - offset];
                if size != 1 {
                    src += i * stride;
                }
                stride *= size;
            }
        }
        out.push(round_to(input.kind == Kind::F32, w.values[src]));
    }
    Some(out)
}

/// The elementwise losses' shared form check: float input, target of its shape and kind.
fn elementwise_ok(case: &LossCase) -> bool {
    case.input.kind.is_float()
        && case.target.shape == case.input.shape
        && case.target.kind == case.input.kind
}

/// An elementwise loss `f(x, t)`, reduced over every element.
fn elementwise(case: &LossCase, mut f: impl FnMut(f64, f64) -> f64) -> Expected {
    let losses: Vec<f64> = case
        .input
        .values
        .iter()
        .zip(&case.target.values)
        .map(|(&x, &t)| f(x, t))
        .collect();
    let n = losses.len() as f64;
    reduce(case.reduce, case.input.shape.clone(), losses, n)
}

fn bce(case: &LossCase, logits: bool) -> Expected {
    let shape = &case.input.shape;
    let ones = || vec![1.0; shape.iter().product()];
    let w = match &case.weight {
        Some(w) => broadcast_to(w, &case.input),
        None => Some(ones()),
    };
    let pw = match (&case.pos_weight, logits) {
        (Some(p), true) => broadcast_to(p, &case.input),
        _ => Some(ones()),
    };
    let (Some(w), Some(pw)) = (w, pw) else {
        return Expected::Refused;
    };
    if !logits && case.input.values.iter().any(|x| !(0.0..=1.0).contains(x)) {
        return Expected::Refused;
    }
    let mut i = 0;
    elementwise(case, |x, t| {
        let (wi, pwi) = (w[i], pw[i]);
        i += 1;
        let l = if logits {
            let softplus_neg = (-x.abs()).exp().ln_1p() + (-x).max(0.0);
            (1.0 - t) * x + (1.0 + (pwi - 1.0) * t) * softplus_neg
        } else {
            -(t * x.ln().max(-100.0) + (1.0 - t) * (1.0 - x).ln().max(-100.0))
        };
        l * wi
    })
}

/// `xlogy(t, t)`: 0 where `t` is 0, NaN where it is negative or NaN.
fn xlogx(t: f64) -> f64 {
    if t == 0.0 {
        0.0
    } else {
        t * t.ln()
    }
}

fn one_hot(case: &LossCase, classes: Option<usize>) -> Expected {
    let labels = &case.target;
    if !labels.kind.is_index() || labels.values.iter().any(|&v| v < 0.0) {
        return Expected::Refused;
    }
    let classes = match classes {
        Some(c) => c,
        None => match labels.values.iter().cloned().reduce(f64::max) {
            Some(m) => m as usize + 1,
            None => return Expected::Refused,
        },
    };
    if labels.values.iter().any(|&v| v >= classes as f64) {
        return Expected::Refused;
    }
    let mut shape = labels.shape.clone();
    shape.push(classes);
    // kiln refuses a shape whose nonzero sizes multiply past what can be addressed, even with
    // a 0 among them (PyTorch accepts an empty tensor of any shape); the generator keeps other
    // outputs small or far beyond any memory.
    let nonzero = (shape.iter().filter(|&&s| s > 0)).try_fold(1usize, |n, &s| n.checked_mul(s));
    let numel = match nonzero {
        Some(n) if n <= isize::MAX as usize => n * usize::from(!shape.contains(&0)),
        _ => return Expected::Refused,
    };
    if numel > 1 << 24 {
        return Expected::Refused;
    }
    let mut values = Vec::new();
    for &v in &labels.values {
        values.extend((0..classes).map(|k| if k as f64 == v { 1.0 } else { 0.0 }));
    }
    value(shape, values)
}

/// What `case` must give.
pub fn expected(case: &LossCase) -> Expected {
    let float_input = case.input.kind.is_float();
    match case.loss {
        Loss::OneHot { classes } => one_hot(case, classes),
        _ if !float_input => Expected::Refused,
        Loss::CrossEntropy { .. } | Loss::Nll { .. }
            if class_geometry_or_none(&case.input.shape).is_none() =>
        {
            Expected::Refused
        }
        Loss::CrossEntropy {
            ignore_index,
            smoothing,
        } => cross_entropy(case, ignore_index, smoothing),
        Loss::Nll { ignore_index } => nll(case, ignore_index),
        _ if !elementwise_ok(case) => Expected::Refused,
        Loss::Bce => bce(case, false),
        Loss::BceWithLogits => bce(case, true),
        Loss::Mse => elementwise(case, |x, t| (x - t) * (x - t)),
        Loss::L1 => elementwise(case, |x, t| (x - t).abs()),
        Loss::SmoothL1 { beta } if !(beta.is_finite() && beta >= 0.0) => Expected::Refused,
        Loss::SmoothL1 { beta } => elementwise(case, |x, t| {
            let d = (x - t).abs();
            if beta == 0.0 {
                d
            } else if d < beta {
                0.5 * d * d / beta
            } else {
                d - 0.5 * beta
            }
        }),
        Loss::Huber { delta } if !(delta.is_finite() && delta > 0.0) => Expected::Refused,
        Loss::Huber { delta } => elementwise(case, |x, t| {
            let d = (x - t).abs();
            if d < delta {
                0.5 * d * d
            } else {
                delta * (d - 0.5 * delta)
            }
        }),
        Loss::KlDiv { log_target } => elementwise(case, |x, t| {
            if log_target {
                t.exp() * (t - x)
            } else {
                xlogx(t) - t * x
            }
        }),
    }
}
