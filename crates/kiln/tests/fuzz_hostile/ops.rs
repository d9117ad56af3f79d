//! Random op calls against the f64 reference ([`crate::reference`]): random shapes (rank 0-4,
//! sizes 0-4, sometimes a permuted, non-contiguous input), f32 or f64, and random ops through
//! the public `Tensor` API: elementwise unary and binary (broadcast, sometimes incompatible),
//! sum / mean / amax / amin / logsumexp / var / std over random dims (negative, out of range,
//! repeated), matmul (matching or not), permute, transpose, narrow, select, reshape (with -1),
//! softmax, log_softmax, index_select (indices in and out of range), clamp, tril and triu. Where PyTorch raises, kiln must return an
//! error; where it does not, kiln must return the reference's shape and values (f64: 1e-12,
//! f32: 1e-5 relative), and in f64 the gradients of a weighted sum of the output with respect
//! to both operands must equal the reference's central differences, or PyTorch's subgradient
//! at a kink (`input_gradient`). A panic, a missing error or a wrong value fails the case.

use crate::harness::{refused, run, Outcome, Rng};
use crate::numeric::{grad_as_seen, leaf_and_view, upstream};
use crate::reference::{self as r, Nd};
use kiln::autograd::{DType, Device, Tensor};

#[derive(Debug, Clone)]
pub enum Op {
    Unary(&'static str),
    Binary(&'static str, Vec<usize>),
    Sum(Vec<isize>, bool),
    Mean(Vec<isize>, bool),
    Amax(Vec<isize>, bool),
    Matmul(Vec<usize>),
    Permute(Vec<isize>),
    Transpose(isize, isize),
    Narrow(isize, usize, usize),
    Select(isize, isize),
    Reshape(Vec<isize>),
    Softmax(isize),
    LogSoftmax(isize),
    IndexSelect(isize, Vec<i64>),
    Amin(Vec<isize>, bool),
    LogSumExp(Vec<isize>, bool),
    /// `var` (`std` when the flag is set) over dims with a correction.
    Var(Vec<isize>, usize, bool, bool),
    Clamp(f64, f64),
    /// `tril` (`triu` when the flag is set) with a diagonal offset.
    Triangle(i64, bool),
}

#[derive(Debug, Clone)]
pub struct OpCase {
    dtype: DType,
    input: Nd,
    /// Make the kiln input a permuted (reversed-dims) view of a contiguous tensor.
    strided: bool,
    op: Op,
    /// The second operand's values (binary ops, matmul).
    other: Vec<f64>,
}

/// `into_relu` and `into_add` are `relu` and `add` on an input handed over (written over it
/// when it is contiguous and shapes allow, computed as the plain op otherwise).
#[rustfmt::skip]
const UNARY: [&str; 17] = [
    "neg", "abs", "exp", "relu", "into_relu", "sigmoid", "tanh", "square", "sqrt",
    "log", "rsqrt", "recip", "erf", "gelu", "gelu_tanh", "silu", "sign",
];
#[rustfmt::skip]
const BINARY: [&str; 8] = [
    "add", "into_add", "sub", "mul", "maximum", "minimum", "div", "pow",
];

fn value(rng: &mut Rng) -> f64 {
    (rng.below(49) as f64 - 24.0) / 8.0
}

fn shape(rng: &mut Rng, min_rank: usize) -> Vec<usize> {
    let rank = min_rank + rng.below(5 - min_rank);
    (0..rank)
        .map(|_| {
            if rng.chance(0.08) {
                0
            } else {
                1 + rng.below(4)
            }
        })
        .collect()
}

fn dim(rng: &mut Rng, rank: usize) -> isize {
    let r = rank.max(1) as isize;
    if rng.chance(0.1) {
        rng.pick(&[r, -r - 1, isize::MAX, isize::MIN])
    } else {
        rng.below(2 * r as usize) as isize - r
    }
}

/// A second operand's shape: the same, broadcastable (dims set to 1 or dropped), or not.
fn other_shape(rng: &mut Rng, s: &[usize]) -> Vec<usize> {
    match rng.below(4) {
        0 => s.to_vec(),
        1 => s
            .iter()
            .map(|&d| if rng.chance(0.5) { 1 } else { d })
            .collect(),
        2 => s[rng.below(s.len() + 1)..].to_vec(),
        _ => shape(rng, 0),
    }
}

fn generate(rng: &mut Rng) -> OpCase {
    let dtype = rng.pick(&[DType::F32, DType::F64]);
    let kind = rng.below(20);
    let in_shape = match kind {
        0 | 1 | 11 | 17 => shape(rng, 0),
        18 => shape(rng, 2),
        5 => {
            if rng.chance(0.5) {
                shape(rng, 2)[..2].to_vec()
            } else {
                shape(rng, 3)[..3].to_vec()
            }
        }
        _ => shape(rng, 1),
    };
    let rank = in_shape.len();
    let dims = |rng: &mut Rng| {
        (0..1 + rng.below(rank.max(1)))
            .map(|_| dim(rng, rank))
            .collect()
    };
    let op = match kind {
        0 => Op::Unary(rng.pick(&UNARY)),
        1 => Op::Binary(rng.pick(&BINARY), other_shape(rng, &in_shape)),
        2 => Op::Sum(dims(rng), rng.chance(0.5)),
        3 => Op::Mean(dims(rng), rng.chance(0.5)),
        4 => Op::Amax(dims(rng), rng.chance(0.5)),
        5 => {
            let mut b = in_shape.clone();
            let n = b.len();
            // [.., k] @ [.., k, n]: the second operand swaps its last dim for a fresh one.
            b[n - 2] = in_shape[n - 1];
            b[n - 1] = 1 + rng.below(4);
            if rng.chance(0.2) {
                b[n - 2] += 1;
            }
            Op::Matmul(b)
        }
        6 => {
            let mut p: Vec<isize> = (0..rank as isize).collect();
            for i in (1..p.len()).rev() {
                p.swap(i, rng.below(i + 1));
            }
            if rng.chance(0.15) && !p.is_empty() {
                p[0] = p[p.len() - 1];
            }
            Op::Permute(
                p.iter()
                    .map(|&d| {
                        if rng.chance(0.3) {
                            d - rank as isize
                        } else {
                            d
                        }
                    })
                    .collect(),
            )
        }
        7 => Op::Transpose(dim(rng, rank), dim(rng, rank)),
        8 => {
            let d = dim(rng, rank);
            Op::Narrow(d, rng.below(4), rng.below(4))
        }
        9 => Op::Select(dim(rng, rank), rng.below(9) as isize - 4),
        10 => {
            let n: usize = in_shape.iter().product();
            let mut target: Vec<isize> = match rng.below(3) {
                0 => vec![n as isize],
                1 => vec![-1],
                _ => shape(rng, 1).iter().map(|&d| d as isize).collect(),
            };
            if rng.chance(0.3) {
                target.insert(0, -1);
            }
            Op::Reshape(target)
        }
        11 => Op::Softmax(dim(rng, rank)),
        12 => Op::LogSoftmax(dim(rng, rank)),
        14 => Op::Amin(dims(rng), rng.chance(0.5)),
        15 => Op::LogSumExp(dims(rng), rng.chance(0.5)),
        16 => Op::Var(dims(rng), rng.below(3), rng.chance(0.5), rng.chance(0.5)),
        17 => Op::Clamp(value(rng), value(rng)),
        18 => Op::Triangle(rng.below(7) as i64 - 3, rng.chance(0.5)),
        _ => {
            let d = dim(rng, rank);
            Op::IndexSelect(
                d,
                (0..rng.below(4)).map(|_| rng.below(6) as i64 - 1).collect(),
            )
        }
    };
    let n: usize = in_shape.iter().product();
    let other_n: usize = match &op {
        Op::Binary(_, s) | Op::Matmul(s) => s.iter().product(),
        _ => 0,
    };
    OpCase {
        dtype,
        input: Nd::new(&in_shape, (0..n).map(|_| value(rng)).collect()),
        strided: rng.chance(0.3),
        op,
        other: (0..other_n).map(|_| value(rng)).collect(),
    }
}

fn tensor(nd: &Nd, dtype: DType) -> Tensor {
    let t = Tensor::from_vec(nd.data.clone(), &nd.shape, Device::Cpu).unwrap();
    t.to_dtype(dtype).unwrap()
}

/// `input` as kiln sees it: contiguous, or a reversed-dims view of a contiguous tensor holding
/// the transposed data (same logical values, other strides).
fn input_tensor(case: &OpCase) -> Tensor {
    let x = &case.input;
    if !case.strided || x.rank() < 2 {
        return tensor(x, case.dtype);
    }
    let rev: Vec<isize> = (0..x.rank() as isize).rev().collect();
    let stored = r::permute(x, &rev).unwrap();
    tensor(&stored, case.dtype).permute(&rev).unwrap()
}

fn unary(name: &str, x: f64) -> f64 {
    match name {
        "neg" => -x,
        "abs" => x.abs(),
        "exp" => x.exp(),
        "relu" | "into_relu" => x.max(0.0),
        "sigmoid" => 1.0 / (1.0 + (-x).exp()),
        "tanh" => x.tanh(),
        "square" => x * x,
        "log" => x.ln(),
        "rsqrt" => 1.0 / x.sqrt(),
        "recip" => 1.0 / x,
        "erf" => r::erf(x),
        "gelu" => 0.5 * x * (1.0 + r::erf(x / std::f64::consts::SQRT_2)),
        "gelu_tanh" => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
        }
        "silu" => x / (1.0 + (-x).exp()),
        // PyTorch's sign: 0 at 0 (Rust's signum gives 1).
        "sign" if x == 0.0 => 0.0,
        "sign" => x.signum(),
        _ => x.abs().sqrt(),
    }
}

/// The reference result, or `None` where PyTorch raises.
fn expected(case: &OpCase) -> Option<Nd> {
    let x = &case.input;
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    match &case.op {
        Op::Unary(name) => Some(x.map(|v| unary(name, v))),
        Op::Binary(name, s) => {
            let b = Nd::new(s, case.other.clone());
            r::binary(x, &b, |p, q| match *name {
                "add" | "into_add" => p + q,
                "sub" => p - q,
                "mul" => p * q,
                "maximum" => p.max(q),
                "minimum" => p.min(q),
                "div" => p / q,
                _ => p.powf(q),
            })
        }
        Op::Sum(d, k) => Some(r::reduce(x, &r::wrap_dims(d, x.rank())?, *k, |v| {
            v.iter().sum()
        })),
        Op::Mean(d, k) => Some(r::reduce(x, &r::wrap_dims(d, x.rank())?, *k, mean)),
        Op::Amax(d, k) => {
            let dims = r::wrap_dims(d, x.rank())?;
            if dims.iter().any(|&i| x.shape[i] == 0) {
                return None;
            }
            Some(r::reduce(x, &dims, *k, |v| {
                v.iter().cloned().fold(f64::MIN, f64::max)
            }))
        }
        Op::Matmul(s) => r::matmul(x, &Nd::new(s, case.other.clone())),
        Op::Permute(p) => r::permute(x, p),
        Op::Transpose(a, b) => {
            let (a, b) = (r::wrap(*a, x.rank())?, r::wrap(*b, x.rank())?);
            let mut p: Vec<isize> = (0..x.rank() as isize).collect();
            p.swap(a, b);
            r::permute(x, &p)
        }
        Op::Narrow(d, s, l) => r::narrow(x, *d, *s, *l),
        Op::Select(d, i) => r::select(x, *d, *i),
        Op::Reshape(t) => {
            let shape = r::reshape_shape(x.data.len(), t)?;
            Some(Nd::new(&shape, x.data.clone()))
        }
        Op::Softmax(d) => r::softmax(x, *d, false),
        Op::LogSoftmax(d) => r::softmax(x, *d, true),
        Op::IndexSelect(d, idx) => r::index_select(x, *d, idx),
        Op::Amin(d, k) => {
            let dims = r::wrap_dims(d, x.rank())?;
            if dims.iter().any(|&i| x.shape[i] == 0) {
                return None;
            }
            Some(r::reduce(x, &dims, *k, |v| {
                v.iter().cloned().fold(f64::MAX, f64::min)
            }))
        }
        Op::LogSumExp(d, k) => Some(r::reduce(x, &r::wrap_dims(d, x.rank())?, *k, |v| {
            let m = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            if m == f64::NEG_INFINITY {
                return m;
            }
            m + v.iter().map(|a| (a - m).exp()).sum::<f64>().ln()
        })),
        Op::Var(d, correction, std, k) => {
            let dims = r::wrap_dims(d, x.rank())?;
            Some(r::reduce(x, &dims, *k, |v| {
                let (n, m) = (v.len() as f64, mean(v));
                // PyTorch divides by max(0, n - correction).
                let dof = (n - *correction as f64).max(0.0);
                let var = v.iter().map(|a| (a - m) * (a - m)).sum::<f64>() / dof;
                if *std {
                    var.sqrt()
                } else {
                    var
                }
            }))
        }
        Op::Clamp(lo, hi) => Some(x.map(|v| v.max(*lo).min(*hi))),
        Op::Triangle(diag, upper) => r::triangle(x, *diag, *upper),
    }
}

fn actual(case: &OpCase) -> kiln::autograd::Result<Tensor> {
    let other = other_operand(case, case.dtype);
    apply(case, input_tensor(case), other.as_ref())
}

/// The second operand of a binary op or matmul, as a `dtype` tensor; `None` for other ops.
fn other_operand(case: &OpCase, dtype: DType) -> Option<Tensor> {
    match &case.op {
        Op::Binary(_, s) | Op::Matmul(s) => Some(tensor(&Nd::new(s, case.other.clone()), dtype)),
        _ => None,
    }
}

/// The case's op on `x` (and the second operand `other` of a binary op or matmul).
fn apply(case: &OpCase, x: Tensor, other: Option<&Tensor>) -> kiln::autograd::Result<Tensor> {
    let other = || other.expect("binary ops and matmul have a second operand");
    match &case.op {
        Op::Unary(name) => match *name {
            "neg" => x.neg(),
            "abs" => x.abs(),
            "exp" => x.exp(),
            "relu" => x.relu(),
            "into_relu" => x.into_relu(),
            "sigmoid" => x.sigmoid(),
            "tanh" => x.tanh(),
            "square" => x.square(),
            "log" => x.log(),
            "rsqrt" => x.rsqrt(),
            "recip" => x.recip(),
            "erf" => x.erf(),
            "gelu" => x.gelu(),
            "gelu_tanh" => x.gelu_tanh(),
            "silu" => x.silu(),
            "sign" => x.sign(),
            _ => x.abs()?.sqrt(),
        },
        Op::Binary(name, _) => {
            let b = other();
            match *name {
                "add" => x.add(b),
                "into_add" => x.into_add(b),
                "sub" => x.sub(b),
                "mul" => x.mul(b),
                "maximum" => x.maximum(b),
                "minimum" => x.minimum(b),
                "div" => x.div(b),
                _ => x.pow(b),
            }
        }
        Op::Sum(d, k) => x.sum(d, *k),
        Op::Mean(d, k) => x.mean(d, *k),
        Op::Amax(d, k) => x.amax(d, *k),
        Op::Matmul(_) => x.matmul(other()),
        Op::Permute(p) => x.permute(p),
        Op::Transpose(a, b) => x.transpose(*a, *b),
        Op::Narrow(d, s, l) => x.narrow(*d, *s, *l),
        Op::Select(d, i) => x.select(*d, *i),
        Op::Reshape(t) => x.reshape(t),
        Op::Softmax(d) => x.softmax(*d),
        Op::LogSoftmax(d) => x.log_softmax(*d),
        Op::IndexSelect(d, idx) => {
            let index = Tensor::from_vec(idx.clone(), &[idx.len()], Device::Cpu)?;
            x.index_select(*d, &index)
        }
        Op::Amin(d, k) => x.amin(d, *k),
        Op::LogSumExp(d, k) => x.logsumexp(d, *k),
        Op::Var(d, c, false, k) => x.var(d, *c, *k),
        Op::Var(d, c, true, k) => x.std(d, *c, *k),
        Op::Clamp(lo, hi) => x.clamp(*lo, *hi),
        Op::Triangle(diag, false) => x.tril(*diag),
        Op::Triangle(diag, true) => x.triu(*diag),
    }
}

fn check(case: &OpCase) -> Outcome {
    let want = expected(case);
    let got = actual(case);
    match (want, got) {
        (None, Err(e)) => refused(e),
        (None, Ok(t)) => panic!("PyTorch raises here, kiln returned shape {:?}", t.shape()),
        (Some(w), Err(e)) => panic!(
            "kiln refused a valid call (reference shape {:?}): {e}",
            w.shape
        ),
        (Some(w), Ok(t)) => {
            assert_eq!(t.shape(), &w.shape[..], "shape");
            assert_eq!(t.dtype(), case.dtype, "dtype");
            let got = t.to_vec_f64().unwrap();
            let tol = if case.dtype == DType::F64 {
                1e-12
            } else {
                1e-5
            };
            for (i, (&g, &e)) in got.iter().zip(&w.data).enumerate() {
                let same =
                    g == e || (g.is_nan() && e.is_nan()) || (g - e).abs() <= tol * e.abs().max(1.0);
                assert!(same, "element {i}: kiln {g}, reference {e}");
            }
            if case.dtype == DType::F64 && w.data.iter().all(|v| v.is_finite()) {
                check_gradients(case);
            }
            Outcome::Accepted
        }
    }
}

/// `Σ upstream(i) · op(x, other)_i` by the reference.
fn weighted_sum(case: &OpCase) -> f64 {
    let out = expected(case).expect("a valid call stays valid");
    out.data
        .iter()
        .enumerate()
        .map(|(i, v)| upstream(i) * v)
        .sum()
}

/// Whether the case's gradient can be checked: central differences give PyTorch's gradient
/// wherever the op is smooth, and [`input_gradient`] writes PyTorch's subgradient at the kinks
/// it knows. Left out: `sqrt(|x|)` at 0 (PyTorch's `0 · inf` is NaN), and `pow` with a base at
/// or below 0 (the gradient with respect to the exponent is NaN there).
fn checkable(case: &OpCase) -> bool {
    match &case.op {
        Op::Unary("sqrt") => case.input.data.iter().all(|&v| v != 0.0),
        Op::Binary("pow", _) => case.input.data.iter().all(|&v| v > 0.0),
        _ => true,
    }
}

/// PyTorch's gradient of `Σ upstream(i) · op(x, other)_i` with respect to the input: central
/// differences (`differences`), except at kinks, where PyTorch defines it: `abs`, `relu` and
/// `sign` give 0 at 0; `clamp` passes it only strictly inside `(min, max)`; `amax` / `amin`
/// split it evenly among tied extremes.
fn input_gradient(case: &OpCase, differences: Vec<f64>) -> Vec<f64> {
    let x = &case.input;
    match &case.op {
        Op::Amax(d, _) | Op::Amin(d, _) => {
            let dims = r::wrap_dims(d, x.rank()).expect("a valid call");
            r::extreme_gradient(x, &dims, matches!(case.op, Op::Amin(..)), upstream)
        }
        Op::Unary(name) if ["abs", "relu", "into_relu", "sign"].contains(name) => x
            .data
            .iter()
            .zip(differences)
            .map(|(&v, f)| if v == 0.0 { 0.0 } else { f })
            .collect(),
        Op::Clamp(lo, hi) => x
            .data
            .iter()
            .zip(differences)
            .map(|(&v, f)| if v == *lo || v == *hi { 0.0 } else { f })
            .collect(),
        _ => differences,
    }
}

/// kiln's gradients of `Σ upstream(i) · op(x, other)_i` (f64) equal the reference's central
/// differences, for the input (through the strided view when the case has one) and for a
/// binary op's or matmul's second operand.
fn check_gradients(case: &OpCase) {
    if !checkable(case) {
        return;
    }
    let x = &case.input;
    let (leaf, input) = leaf_and_view(&x.data, &x.shape, false, case.strided);
    let other = other_operand(case, DType::F64).map(|t| t.set_requires_grad(true).unwrap());
    let out = apply(case, input, other.as_ref()).expect("the same call again");
    let n = out.numel();
    let w = Tensor::from_vec((0..n).map(upstream).collect(), out.shape(), Device::Cpu).unwrap();
    out.mul(&w)
        .and_then(|y| y.sum_all())
        .and_then(|l| l.backward())
        .expect("backward");
    let h = 1e-6;
    let differences = |of_other: bool| -> Vec<f64> {
        let len = if of_other {
            case.other.len()
        } else {
            x.data.len()
        };
        (0..len)
            .map(|k| {
                let at = |delta: f64| {
                    let mut c = case.clone();
                    match of_other {
                        true => c.other[k] += delta,
                        false => c.input.data[k] += delta,
                    }
                    weighted_sum(&c)
                };
                (at(h) - at(-h)) / (2.0 * h)
            })
            .collect()
    };
    let mut grads = vec![(false, grad_as_seen(&leaf, x.data.len(), case.strided))];
    if let Some(o) = other {
        let g = o.grad().expect("a gradient after backward");
        grads.push((true, g.to_vec_f64().unwrap()));
    }
    for (of_other, got) in grads {
        let want = match of_other {
            true => differences(true),
            false => input_gradient(case, differences(false)),
        };
        assert_eq!(got.len(), want.len(), "gradient length");
        for (k, (&g, &f)) in got.iter().zip(&want).enumerate() {
            let which = if of_other { "other" } else { "input" };
            assert!(
                (g - f).abs() <= 1e-6 * (1.0 + f.abs()),
                "d/d{which}[{k}]: kiln {g}, differences {f}"
            );
        }
    }
}

pub fn random_ops(seed: u64, cases: usize) {
    run(
        "random op calls vs an f64 reference",
        seed,
        cases,
        generate,
        check,
    );
}
