//! Reductions with indices, norms, comparisons, scalar ops and shape views against a reference
//! ([`crate::reduce_reference`]) written from PyTorch 2.15's definitions: `max_dim` / `min_dim` / `argmin` (values, indices,
//! gradient to the selected element), `max_all` / `min_all` (ties share the gradient),
//! `norm` (p = 1, 2, 3, 0.5, inf and hostile ones; PyTorch's gradient, 0 where the norm is 0),
//! the six comparisons (tensor and scalar, broadcast, NaN) and `logical_and` / `logical_not`,
//! the scalar ops (`add`, `sub`, `rsub`, `mul`, `div`, `pow`, `maximum`, `minimum` with NaN,
//! infinite and zero scalars; `maximum_scalar` / `minimum_scalar` are `clamp_min` /
//! `clamp_max`, whose gradient is 0 at a tie) and the views `expand`, `squeeze_dim`,
//! `unsqueeze`, `flatten`, `chunk`, `split`, `split_sizes` (hostile sizes included), on random
//! shapes (rank 0-3, sizes 0-3, sometimes a non-contiguous input), f32 or f64.
//!
//! The check: where the reference refuses, kiln must return an error; otherwise shapes,
//! indices and Bool outputs must be equal, values equal (not finite where the reference is not;
//! 1e-12 / 1e-5 relative), and the gradient of `Σ G ⊙ output` with respect to the input
//! (pieces concatenated) equal to PyTorch's.
//!
//! Where kiln deliberately differs: `norm` takes only a positive `p` (PyTorch's `p = 0` counts
//! nonzeros, a negative `p` is a harmonic-like mean); `expand` takes no -1.

use crate::harness::{refused, run, Outcome, Rng};
use crate::numeric::{assert_close, float_tensor, grad_as_seen, leaf_and_view, upstream};
use crate::reduce_reference::{expected, Case, Op};
use crate::reference::Nd;
use kiln::autograd::{DType, Tensor};

const COMPARE: [&str; 6] = ["eq", "ne", "lt", "le", "gt", "ge"];
const SCALAR: [&str; 8] = [
    "add", "sub", "rsub", "mul", "div", "pow", "maximum", "minimum",
];

fn value(rng: &mut Rng) -> f64 {
    match rng.below(25) {
        0 => f64::NAN,
        1 => f64::INFINITY,
        2 => -0.0,
        _ => (rng.below(9) as f64 - 4.0) / 2.0,
    }
}

fn shape(rng: &mut Rng) -> Vec<usize> {
    (0..rng.below(4))
        .map(|_| if rng.chance(0.1) { 0 } else { 1 + rng.below(3) })
        .collect()
}

fn dim(rng: &mut Rng, rank: usize) -> isize {
    let r = rank.max(1) as isize;
    match rng.below(12) {
        0 => rng.pick(&[r, -r - 1, isize::MAX, isize::MIN]),
        _ => rng.below(2 * r as usize) as isize - r,
    }
}

fn size(rng: &mut Rng) -> usize {
    match rng.below(10) {
        0 => rng.pick(&[0, usize::MAX, usize::MAX / 2 + 1]),
        _ => rng.below(5),
    }
}

fn generate(rng: &mut Rng) -> Case {
    let s = shape(rng);
    let rank = s.len();
    let d = dim(rng, rank);
    let other_shape = |rng: &mut Rng| match rng.below(3) {
        0 => s.clone(),
        1 => s
            .iter()
            .map(|&k| if rng.chance(0.5) { 1 } else { k })
            .collect(),
        _ => shape(rng),
    };
    let op = match rng.below(14) {
        0 => Op::ExtremeDim(d, rng.chance(0.5), rng.chance(0.5)),
        1 => Op::Argmin(d, rng.chance(0.5)),
        2 => Op::ExtremeAll(rng.chance(0.5)),
        3 => {
            let p = match rng.chance(0.85) {
                true => rng.pick(&[1.0, 2.0, 3.0, 0.5, f64::INFINITY]),
                false => rng.pick(&[0.0, -1.0, f64::NEG_INFINITY, f64::NAN]),
            };
            let dims = (0..rng.below(rank + 1)).map(|_| dim(rng, rank)).collect();
            Op::Norm(p, dims, rng.chance(0.5))
        }
        4 | 5 => {
            let other = rng.chance(0.7).then(|| other_shape(rng));
            Op::Compare(rng.pick(&COMPARE), other)
        }
        6 => Op::Logical(rng.chance(0.6).then(|| other_shape(rng))),
        7 | 8 => {
            let v = match rng.chance(0.8) {
                true => (rng.below(9) as f64 - 4.0) / 2.0,
                false => rng.pick(&[f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0]),
            };
            Op::Scalar(rng.pick(&SCALAR), v)
        }
        9 => {
            let mut t: Vec<usize> = (0..rng.below(2)).map(|_| rng.below(3)).collect();
            t.extend(s.iter().map(|&k| match rng.below(4) {
                0 if k == 1 => rng.below(4),
                1 => rng.below(3),
                _ => k,
            }));
            Op::Expand(t)
        }
        10 => match rng.chance(0.5) {
            true => Op::SqueezeDim(d),
            false => Op::Unsqueeze(dim(rng, rank + 1)),
        },
        11 => Op::Flatten(d, dim(rng, rank)),
        12 => match rng.chance(0.5) {
            true => Op::Chunk(size(rng), d),
            false => Op::Split(size(rng), d),
        },
        _ => Op::SplitSizes((0..rng.below(4)).map(|_| size(rng)).collect(), d),
    };
    let n = s.iter().product();
    let other_n = match &op {
        Op::Compare(_, Some(o)) | Op::Logical(Some(o)) => o.iter().product(),
        Op::Compare(_, None) => 1,
        _ => 0,
    };
    Case {
        f32: rng.chance(0.5),
        x: Nd::new(&s, (0..n).map(|_| value(rng)).collect()),
        strided: rng.chance(0.3),
        op,
        other: (0..other_n).map(|_| value(rng)).collect(),
    }
}

/// kiln's outputs (one, or the pieces of a split) and indices.
type Got = (Vec<Tensor>, Option<Tensor>);

fn actual(case: &Case, x: &Tensor) -> kiln::autograd::Result<Got> {
    let other = |s: &[usize]| float_tensor(&case.other, s, case.f32, false);
    let one = |t: Tensor| (vec![t], None);
    Ok(match &case.op {
        Op::ExtremeDim(d, k, false) => x.max_dim(*d, *k).map(|(v, i)| (vec![v], Some(i)))?,
        Op::ExtremeDim(d, k, true) => x.min_dim(*d, *k).map(|(v, i)| (vec![v], Some(i)))?,
        Op::Argmin(d, k) => (vec![], Some(x.argmin(*d, *k)?)),
        Op::ExtremeAll(false) => one(x.max_all()?),
        Op::ExtremeAll(true) => one(x.min_all()?),
        Op::Norm(p, dims, k) => one(x.norm(*p, dims, *k)?),
        Op::Compare(name, shape) => {
            let o = other(shape.as_deref().unwrap_or(&[]));
            one(match (*name, shape.is_some()) {
                ("eq", true) => x.eq(&o)?,
                ("ne", true) => x.ne(&o)?,
                ("lt", true) => x.lt(&o)?,
                ("le", true) => x.le(&o)?,
                ("gt", true) => x.gt(&o)?,
                ("ge", true) => x.ge(&o)?,
                ("eq", false) => x.eq_scalar(case.other[0])?,
                ("ne", false) => x.ne_scalar(case.other[0])?,
                ("lt", false) => x.lt_scalar(case.other[0])?,
                ("le", false) => x.le_scalar(case.other[0])?,
                ("gt", false) => x.gt_scalar(case.other[0])?,
                _ => x.ge_scalar(case.other[0])?,
            })
        }
        Op::Logical(Some(s)) => one(x.gt_scalar(0.0)?.logical_and(&other(s).gt_scalar(0.0)?)?),
        Op::Logical(None) => one(x.gt_scalar(0.0)?.logical_not()?),
        Op::Scalar(name, v) => one(match *name {
            "add" => x.add_scalar(*v)?,
            "sub" => x.sub_scalar(*v)?,
            "rsub" => x.rsub_scalar(*v)?,
            "mul" => x.mul_scalar(*v)?,
            "div" => x.div_scalar(*v)?,
            "pow" => x.pow_scalar(*v)?,
            "maximum" => x.maximum_scalar(*v)?,
            _ => x.minimum_scalar(*v)?,
        }),
        Op::Expand(t) => one(x.expand(t)?),
        Op::SqueezeDim(d) => one(x.squeeze_dim(*d)?),
        Op::Unsqueeze(d) => one(x.unsqueeze(*d)?),
        Op::Flatten(a, b) => one(x.flatten(*a, *b)?),
        Op::Chunk(n, d) => (x.chunk(*n, *d)?, None),
        Op::Split(n, d) => (x.split(*n, *d)?, None),
        Op::SplitSizes(s, d) => (x.split_sizes(s, *d)?, None),
    })
}

fn check(case: &Case) -> Outcome {
    let (leaf, x) = leaf_and_view(&case.x.data, &case.x.shape, case.f32, case.strided);
    let (want, (outputs, picks)) = match (expected(case), actual(case, &x)) {
        (None, Err(e)) => return refused(e),
        (None, Ok((o, _))) => panic!(
            "PyTorch raises here, kiln returned shapes {:?}",
            o.iter().map(|t| t.shape().to_vec()).collect::<Vec<_>>()
        ),
        (Some(_), Err(e)) => panic!("kiln refused a valid call: {e}"),
        (Some(w), Ok(got)) => (w, got),
    };
    if let Some(want) = &want.indices {
        assert_eq!(
            picks.expect("indices").to_vec::<i64>().unwrap(),
            *want,
            "indices"
        );
    }
    let shapes: Vec<Vec<usize>> = outputs.iter().map(|t| t.shape().to_vec()).collect();
    if outputs.is_empty() && want.values.is_empty() {
        return Outcome::Accepted;
    }
    assert_eq!(shapes, want.shapes, "shapes");
    let values: Vec<f64> = outputs
        .iter()
        .flat_map(|t| t.to_vec_f64().unwrap())
        .collect();
    let Some(grad) = &want.grad else {
        assert_eq!(outputs[0].dtype(), DType::Bool, "a comparison's dtype");
        assert_eq!(values, want.values, "Bool values");
        return Outcome::Accepted;
    };
    let tol = if case.f32 { 1e-5 } else { 1e-12 };
    assert_close("values", &values, &want.values, tol);
    let mut loss: Option<Tensor> = None;
    let mut offset = 0;
    for t in &outputs {
        let n = t.numel();
        let g: Vec<f64> = (offset..offset + n).map(upstream).collect();
        let term = t
            .mul(&float_tensor(&g, t.shape(), case.f32, false))
            .unwrap()
            .sum_all()
            .unwrap();
        loss = Some(match loss {
            None => term,
            Some(l) => l.add(&term).unwrap(),
        });
        offset += n;
    }
    if let Some(l) = loss.filter(|l| l.requires_grad()) {
        l.backward().expect("backward");
    }
    let got = grad_as_seen(&leaf, case.x.data.len(), case.strided);
    assert_close("gradient", &got, grad, if case.f32 { 1e-4 } else { 1e-9 });
    Outcome::Accepted
}

pub fn reduce_and_view_calls(seed: u64, cases: usize) {
    run(
        "reductions, comparisons, scalar ops and views vs a reference",
        seed,
        cases,
        generate,
        check,
    );
}
