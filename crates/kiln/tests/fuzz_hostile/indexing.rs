//! Indexing, selection and joining calls against the f64 reference
//! ([`crate::index_reference`]): `gather`, `scatter`, `scatter_add`, `embedding` (with
//! `padding_idx`), `topk`, `masked_fill`, `where`, `cat`, `stack` and `argmax`, on random
//! shapes (rank 0-3, sizes 0-3, the first operand sometimes a non-contiguous view), f32 or
//! f64, values with ties, signed zeros, NaN and infinities, and indices in range, out of range,
//! negative or extreme, of right and wrong shapes.
//!
//! The check: where the reference refuses, kiln must return an error; otherwise the values
//! must equal the reference's (bit for bit where an output element is a copy; 1e-12 / 1e-6
//! relative where it is a sum), the indices exactly, and the gradients of `Σ G ⊙ output` with
//! respect to every float operand must equal PyTorch's (a missing gradient counts as zeros).

use crate::harness::{refused, run, Outcome, Rng};
use crate::index_reference::{self as r, BoolNd, Expected, IntNd};
use crate::numeric::{assert_close, grad_as_seen, leaf_and_view, upstream};
use crate::reference::Nd;
use kiln::autograd::{Device, Tensor};

#[derive(Debug, Clone)]
pub enum IndexOp {
    Gather(isize, IntNd),
    /// `scatter` (`scatter_add` when set) of operand 1 into operand 0.
    Scatter(isize, IntNd, bool),
    /// Operand 0 is the weight.
    Embedding(IntNd, Option<i64>),
    Topk(usize, isize, bool),
    MaskedFill(BoolNd, f64),
    /// `where(cond, operand 0, operand 1)`.
    Where(BoolNd),
    /// `cat` (`stack` when set) of every operand.
    Join(isize, bool),
    Argmax(isize, bool),
}

#[derive(Debug, Clone)]
pub struct IndexCase {
    f32: bool,
    operands: Vec<Nd>,
    /// Operand 0 is a reversed-dims view of a contiguous tensor.
    strided: bool,
    op: IndexOp,
}

fn value(rng: &mut Rng) -> f64 {
    match rng.below(30) {
        0 => f64::NAN,
        1 => f64::INFINITY,
        2 => f64::NEG_INFINITY,
        3 => -0.0,
        _ => (rng.below(13) as f64 - 6.0) / 2.0,
    }
}

fn shape(rng: &mut Rng) -> Vec<usize> {
    (0..rng.below(4))
        .map(|_| {
            if rng.chance(0.08) {
                0
            } else {
                1 + rng.below(3)
            }
        })
        .collect()
}

fn floats(rng: &mut Rng, shape: &[usize]) -> Nd {
    let n = shape.iter().product();
    Nd {
        shape: shape.to_vec(),
        data: (0..n).map(|_| value(rng)).collect(),
    }
}

fn dim(rng: &mut Rng, rank: usize) -> isize {
    let r = rank.max(1) as isize;
    match rng.below(12) {
        0 => rng.pick(&[r, -r - 1, isize::MAX, isize::MIN]),
        _ => rng.below(2 * r as usize) as isize - r,
    }
}

/// An index below `size`, sometimes out of range or extreme.
fn index_value(rng: &mut Rng, size: usize) -> i64 {
    match rng.below(14) {
        0 => rng.pick(&[-1, size as i64, i64::MIN, i64::MAX]),
        _ => rng.below(size.max(1)) as i64,
    }
}

/// A shape like `s` (each dim sometimes smaller, larger or 0), or another rank.
fn near(rng: &mut Rng, s: &[usize]) -> Vec<usize> {
    if rng.chance(0.1) {
        return shape(rng);
    }
    s.iter()
        .map(|&d| match rng.below(8) {
            0 => d + 1,
            1 => 0,
            2 | 3 => rng.below(d + 1),
            _ => d,
        })
        .collect()
}

/// A shape that broadcasts with `s` (dims set to 1 or dropped), or not.
fn broadcasting(rng: &mut Rng, s: &[usize]) -> Vec<usize> {
    match rng.below(5) {
        0 => s.to_vec(),
        1 | 2 => s
            .iter()
            .map(|&d| if rng.chance(0.5) { 1 } else { d })
            .collect(),
        3 => s[rng.below(s.len() + 1)..].to_vec(),
        _ => shape(rng),
    }
}

fn ints(rng: &mut Rng, shape: &[usize], size: usize) -> IntNd {
    let n = shape.iter().product();
    IntNd {
        shape: shape.to_vec(),
        data: (0..n).map(|_| index_value(rng, size)).collect(),
    }
}

fn bools(rng: &mut Rng, shape: &[usize]) -> BoolNd {
    let n = shape.iter().product();
    BoolNd {
        shape: shape.to_vec(),
        data: (0..n).map(|_| rng.chance(0.5)).collect(),
    }
}

fn generate(rng: &mut Rng) -> IndexCase {
    let f32 = rng.chance(0.5);
    let x = shape(rng);
    let rank = x.len();
    let d = dim(rng, rank);
    let size = |d: isize| {
        let s = if x.is_empty() { vec![1] } else { x.clone() };
        r_wrap(d, rank).map_or(2, |k| s[k])
    };
    let mut operands = vec![floats(rng, &x)];
    let op = match rng.below(9) {
        0 => {
            let index = near(rng, &x);
            IndexOp::Gather(d, ints(rng, &index, size(d)))
        }
        1 => {
            let index = near(rng, &x);
            let src = near(rng, &index);
            operands.push(floats(rng, &src));
            IndexOp::Scatter(d, ints(rng, &index, size(d)), rng.chance(0.5))
        }
        2 => {
            let weight = match rng.below(10) {
                0 => shape(rng),
                _ => vec![rng.below(5), rng.below(4)],
            };
            operands[0] = floats(rng, &weight);
            let num = weight.first().copied().unwrap_or(0);
            let padding = rng
                .chance(0.5)
                .then(|| rng.below(2 * num + 3) as i64 - num as i64 - 1);
            let index = shape(rng);
            IndexOp::Embedding(ints(rng, &index, num), padding)
        }
        3 => IndexOp::Topk(rng.below(size(d) + 2), d, rng.chance(0.5)),
        4 => {
            let fill = rng.pick(&[0.0, -1.5, f64::NAN, f64::NEG_INFINITY]);
            let mask = broadcasting(rng, &x);
            IndexOp::MaskedFill(bools(rng, &mask), fill)
        }
        5 => {
            let (other, cond) = (broadcasting(rng, &x), broadcasting(rng, &x));
            operands.push(floats(rng, &other));
            IndexOp::Where(bools(rng, &cond))
        }
        6 | 7 => {
            let stack = rng.chance(0.4);
            for _ in 0..rng.below(3) {
                let part = match rng.below(6) {
                    0 => vec![0],
                    1 => shape(rng),
                    _ if stack => x.clone(),
                    _ => {
                        let mut s = x.clone();
                        if let Some(k) = r_wrap(d, rank).filter(|_| rank > 0) {
                            s[k] = rng.below(3);
                        }
                        s
                    }
                };
                operands.push(floats(rng, &part));
            }
            if rng.chance(0.15) {
                operands[0] = floats(rng, &[0]);
            }
            IndexOp::Join(d, stack)
        }
        _ => IndexOp::Argmax(d, rng.chance(0.5)),
    };
    IndexCase {
        f32,
        operands,
        strided: rng.chance(0.3),
        op,
    }
}

fn r_wrap(d: isize, rank: usize) -> Option<usize> {
    crate::reference::wrap(d, rank)
}

fn expected(case: &IndexCase) -> Option<Expected> {
    let ops = &case.operands;
    match &case.op {
        IndexOp::Gather(d, i) => r::gather(&ops[0], *d, i),
        IndexOp::Scatter(d, i, add) => r::scatter(&ops[0], *d, i, &ops[1], *add),
        IndexOp::Embedding(i, p) => r::embedding(&ops[0], i, *p),
        IndexOp::Topk(k, d, largest) => r::topk(&ops[0], *k, *d, *largest),
        IndexOp::MaskedFill(m, v) => r::masked_fill(&ops[0], m, *v),
        IndexOp::Where(c) => r::where_(c, &ops[0], &ops[1]),
        IndexOp::Join(d, stack) => r::join(ops, *d, *stack),
        IndexOp::Argmax(d, k) => r::argmax(&ops[0], *d, *k),
    }
}

fn index_tensor(i: &IntNd) -> Tensor {
    Tensor::from_vec(i.data.clone(), &i.shape, Device::Cpu).unwrap()
}

fn bool_tensor(b: &BoolNd) -> Tensor {
    let v = b.data.iter().map(|&t| t as u8 as f64).collect();
    let t = Tensor::from_vec(v, &b.shape, Device::Cpu).unwrap();
    t.gt_scalar(0.5).unwrap()
}

/// The float operands as leaves that require grad, and as the op sees them (operand 0 through
/// a reversed-dims view when the case is strided).
fn operands(case: &IndexCase) -> (Vec<Tensor>, Vec<Tensor>) {
    case.operands
        .iter()
        .enumerate()
        .map(|(k, o)| leaf_and_view(&o.data, &o.shape, case.f32, k == 0 && case.strided))
        .unzip()
}

/// kiln's values (`None` for `argmax`) and indices (`topk`, `argmax`).
type Got = (Option<Tensor>, Option<Tensor>);

fn actual(case: &IndexCase, ops: &[Tensor]) -> kiln::autograd::Result<Got> {
    let x = &ops[0];
    Ok(match &case.op {
        IndexOp::Gather(d, i) => (Some(x.gather(*d, &index_tensor(i))?), None),
        IndexOp::Scatter(d, i, false) => (Some(x.scatter(*d, &index_tensor(i), &ops[1])?), None),
        IndexOp::Scatter(d, i, true) => (Some(x.scatter_add(*d, &index_tensor(i), &ops[1])?), None),
        IndexOp::Embedding(i, p) => (Some(Tensor::embedding(&index_tensor(i), x, *p)?), None),
        IndexOp::Topk(k, d, largest) => {
            let (v, i) = x.topk(*k, *d, *largest, true)?;
            (Some(v), Some(i))
        }
        IndexOp::MaskedFill(m, v) => (Some(x.masked_fill(&bool_tensor(m), *v)?), None),
        IndexOp::Where(c) => (Some(Tensor::where_(&bool_tensor(c), x, &ops[1])?), None),
        IndexOp::Join(d, false) => (Some(Tensor::cat(ops, *d)?), None),
        IndexOp::Join(d, true) => (Some(Tensor::stack(ops, *d)?), None),
        IndexOp::Argmax(d, k) => (None, Some(x.argmax(*d, *k)?)),
    })
}

fn check(case: &IndexCase) -> Outcome {
    let (leaves, seen) = operands(case);
    match (expected(case), actual(case, &seen)) {
        (None, Err(e)) => refused(e),
        (None, Ok((v, i))) => panic!(
            "PyTorch raises here, kiln returned shapes {:?} / {:?}",
            v.map(|t| t.shape().to_vec()),
            i.map(|t| t.shape().to_vec())
        ),
        (Some(_), Err(e)) => panic!("kiln refused a valid call: {e}"),
        (Some(want), Ok((values, picks))) => {
            if let Some(want) = &want.indices {
                let got = picks.expect("indices");
                assert_eq!(got.shape(), &want.shape[..], "indices' shape");
                assert_eq!(got.to_vec::<i64>().unwrap(), want.data, "indices");
            }
            if let Some(want) = &want.values {
                check_values(case, want, &values.expect("values"), &leaves);
            }
            Outcome::Accepted
        }
    }
}

fn check_values(case: &IndexCase, want: &r::Linear, got: &Tensor, leaves: &[Tensor]) {
    assert_eq!(got.shape(), &want.shape[..], "shape");
    let values = got.to_vec_f64().unwrap();
    let reference = want.values(&case.operands);
    let tol = if case.f32 { 1e-6 } else { 1e-12 };
    if want.terms.iter().all(|t| t.len() <= 1) {
        for (i, (&g, &w)) in values.iter().zip(&reference).enumerate() {
            let w = if case.f32 { w as f32 as f64 } else { w };
            let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
            assert!(same, "element {i}: kiln {g}, reference {w} (a copy)");
        }
    } else {
        assert_close("values", &values, &reference, tol);
    }
    let n = got.numel();
    let g = Tensor::from_vec((0..n).map(upstream).collect(), got.shape(), Device::Cpu).unwrap();
    let g = g.to_dtype(got.dtype()).unwrap();
    got.mul(&g)
        .and_then(|y| y.sum_all())
        .and_then(|l| l.backward())
        .expect("backward");
    for (k, (leaf, o)) in leaves.iter().zip(&case.operands).enumerate() {
        let want = want.gradient(k, o.data.len(), upstream);
        let got = grad_as_seen(leaf, o.data.len(), k == 0 && case.strided);
        assert_close(&format!("d/d operand {k}"), &got, &want, tol);
    }
}

pub fn index_calls(seed: u64, cases: usize) {
    run(
        "indexing, selection and joining calls vs an f64 reference",
        seed,
        cases,
        generate,
        check,
    );
}
