//! The reference of the reductions-and-views target ([`crate::reduce_views`]), written from
//! PyTorch 2.15's definitions and checked against it by hand on the edge cases: which calls
//! raise, the outputs (pieces, for the splits), the indices, and the input's gradient under
//! PyTorch's backward rules, including its conventions where a formula gives NaN (a zero norm
//! or element, ties, NaN elements). Where kiln deliberately differs is listed in the target's
//! docs.

use crate::numeric::upstream;
use crate::reference::{broadcast_shape, flat, indices, lines, wrap, wrap_dims, Nd};
use kiln::autograd::MAX_EMPTY_CHUNKS;

#[derive(Debug, Clone)]
pub enum Op {
    /// `max_dim` (`min_dim` when set).
    ExtremeDim(isize, bool, bool),
    Argmin(isize, bool),
    /// `max_all` (`min_all` when set).
    ExtremeAll(bool),
    Norm(f64, Vec<isize>, bool),
    /// A comparison with a second operand of this shape (a scalar when `None`).
    Compare(&'static str, Option<Vec<usize>>),
    /// `logical_and` of `x > 0` with `other > 0` (`logical_not` of `x > 0` when `None`).
    Logical(Option<Vec<usize>>),
    Scalar(&'static str, f64),
    Expand(Vec<usize>),
    SqueezeDim(isize),
    Unsqueeze(isize),
    Flatten(isize, isize),
    Chunk(usize, isize),
    Split(usize, isize),
    SplitSizes(Vec<usize>, isize),
}

#[derive(Debug, Clone)]
pub struct Case {
    pub f32: bool,
    pub x: Nd,
    pub strided: bool,
    pub op: Op,
    pub other: Vec<f64>,
}

/// The reference's answer: output pieces (one unless split), their values or Bool 0/1,
/// indices, and the input's gradient for `Σ upstream(i) · output_i` over the pieces in order
/// (`None`: no gradient, a Bool or index output).
#[derive(Debug)]
pub struct Expected {
    pub shapes: Vec<Vec<usize>>,
    pub values: Vec<f64>,
    pub indices: Option<Vec<i64>>,
    pub grad: Option<Vec<f64>>,
}

/// Output `i` copies input `from[i]`: values, and the gradient summed back.
fn copies(x: &Nd, shapes: Vec<Vec<usize>>, from: Vec<usize>) -> Expected {
    let mut grad = vec![0.0; x.data.len()];
    for (i, &j) in from.iter().enumerate() {
        grad[j] += upstream(i);
    }
    Expected {
        shapes,
        values: from.iter().map(|&j| x.data[j]).collect(),
        indices: None,
        grad: Some(grad),
    }
}

/// `a` is picked over `b` by max (min when `min`): NaN first, then the extreme, first on ties.
fn beats(a: f64, b: f64, min: bool) -> bool {
    match (a.is_nan(), b.is_nan()) {
        (true, b_nan) => !b_nan,
        (false, true) => false,
        _ => (!min && a > b) || (min && a < b),
    }
}

fn reduced_shape(shape: &[usize], d: usize, keepdim: bool) -> Vec<usize> {
    let mut s = shape.to_vec();
    if !s.is_empty() {
        if keepdim {
            s[d] = 1;
        } else {
            s.remove(d);
        }
    }
    s
}

fn extreme_dim(x: &Nd, dim: isize, keepdim: bool, min: bool, values: bool) -> Option<Expected> {
    let d = wrap(dim, x.rank())?;
    if x.rank() > 0 && x.shape[d] == 0 {
        return None;
    }
    let picks: Vec<usize> = lines(&x.shape, d)
        .iter()
        .map(|line| {
            (1..line.len()).fold(0, |best, k| {
                match beats(x.data[line[k]], x.data[line[best]], min) {
                    true => k,
                    false => best,
                }
            })
        })
        .collect();
    let from: Vec<usize> = lines(&x.shape, d)
        .iter()
        .zip(&picks)
        .map(|(l, &k)| l[k])
        .collect();
    let shape = reduced_shape(&x.shape, d, keepdim);
    let mut e = copies(x, vec![shape], from);
    e.indices = Some(picks.iter().map(|&k| k as i64).collect());
    if !values {
        e.values.clear();
        e.grad = None;
    }
    Some(e)
}

/// `max_all` / `min_all`: NaN wins; the gradient is shared by the elements equal to the result
/// (by the NaNs when it is NaN).
fn extreme_all(x: &Nd, min: bool) -> Option<Expected> {
    let first = *x.data.first()?;
    let v = x
        .data
        .iter()
        .fold(first, |m, &a| if beats(a, m, min) { a } else { m });
    let hit = |a: f64| a == v || (a.is_nan() && v.is_nan());
    let ties = x.data.iter().filter(|&&a| hit(a)).count() as f64;
    let grad = x
        .data
        .iter()
        .map(|&a| if hit(a) { upstream(0) / ties } else { 0.0 })
        .collect();
    Some(Expected {
        shapes: vec![vec![]],
        values: vec![v],
        indices: None,
        grad: Some(grad),
    })
}

fn norm(x: &Nd, p: f64, dims: &[isize], keepdim: bool) -> Option<Expected> {
    if p.is_nan() || p <= 0.0 {
        return None;
    }
    let mut d = wrap_dims(dims, x.rank())?;
    if dims.is_empty() || x.rank() == 0 {
        d = (0..x.rank()).collect();
    }
    if p == f64::INFINITY && d.iter().any(|&k| x.shape[k] == 0) {
        return None;
    }
    let kept: Vec<usize> = (0..x.rank())
        .map(|k| if d.contains(&k) { 1 } else { x.shape[k] })
        .collect();
    let slot = |at: &[usize]| {
        let at: Vec<usize> = at
            .iter()
            .enumerate()
            .map(|(k, &i)| if d.contains(&k) { 0 } else { i })
            .collect();
        flat(&kept, &at)
    };
    let all = indices(&x.shape);
    let n_out: usize = kept.iter().product();
    let mut acc = vec![0.0f64; n_out];
    for (j, at) in all.iter().enumerate() {
        let a = x.data[j].abs();
        let o = slot(at);
        acc[o] = match p {
            f64::INFINITY if a.is_nan() || acc[o].is_nan() => f64::NAN,
            f64::INFINITY => acc[o].max(a),
            1.0 => acc[o] + a,
            2.0 => acc[o] + a * a,
            _ => acc[o] + a.powf(p),
        };
    }
    let values: Vec<f64> = acc
        .iter()
        .map(|&s| match p {
            f64::INFINITY | 1.0 => s,
            2.0 => s.sqrt(),
            _ => s.powf(1.0 / p),
        })
        .collect();
    let ties: Vec<f64> = (0..n_out)
        .map(|o| {
            all.iter()
                .enumerate()
                .filter(|(j, at)| slot(at) == o && x.data[*j].abs() == values[o])
                .count() as f64
        })
        .collect();
    let grad = all
        .iter()
        .enumerate()
        .map(|(j, at)| {
            let (v, o) = (x.data[j], slot(at));
            let n = values[o];
            // PyTorch's zeros where the formulas give NaN: a zero norm, a zero element, a NaN
            // element of a 1-norm.
            let local = if n == 0.0 || v == 0.0 || (p == 1.0 && v.is_nan()) {
                0.0
            } else {
                match p {
                    f64::INFINITY if v.abs() == n => v.signum() / ties[o],
                    f64::INFINITY => 0.0,
                    1.0 => v.signum(),
                    2.0 => v / n,
                    _ => v.signum() * v.abs().powf(p - 1.0) / n.powf(p - 1.0),
                }
            };
            upstream(o) * local
        })
        .collect();
    let mut shape = kept;
    if !keepdim {
        shape = (0..x.rank())
            .filter(|k| !d.contains(k))
            .map(|k| x.shape[k])
            .collect();
    }
    Some(Expected {
        shapes: vec![shape],
        values,
        indices: None,
        grad: Some(grad),
    })
}

fn compare(name: &str, a: f64, b: f64) -> bool {
    match name {
        "eq" => a == b,
        "ne" => a != b,
        "lt" => a < b,
        "le" => a <= b,
        "gt" => a > b,
        _ => a >= b,
    }
}

/// A Bool output of the broadcast of `x` with `other`: `f(x_i, other_i)`.
fn elementwise_bool(x: &Nd, other: &Nd, f: impl Fn(f64, f64) -> bool) -> Option<Expected> {
    let shape = broadcast_shape(&x.shape, &other.shape)?;
    let read = |t: &Nd, at: &[usize]| {
        let skip = shape.len() - t.rank();
        let i: Vec<usize> = (0..t.rank())
            .map(|k| if t.shape[k] == 1 { 0 } else { at[skip + k] })
            .collect();
        t.data[flat(&t.shape, &i)]
    };
    let values = indices(&shape)
        .iter()
        .map(|at| f(read(x, at), read(other, at)) as u8 as f64)
        .collect();
    Some(Expected {
        shapes: vec![shape],
        values,
        indices: None,
        grad: None,
    })
}

fn scalar_op(x: &Nd, name: &str, v: f64) -> Expected {
    let (values, local): (Vec<f64>, Vec<f64>) = x
        .data
        .iter()
        .map(|&a| match name {
            "add" => (a + v, 1.0),
            "sub" => (a - v, 1.0),
            "rsub" => (v - a, -1.0),
            "mul" => (a * v, v),
            "div" => (a / v, 1.0 / v),
            "pow" if v == 0.0 => (a.powf(v), 0.0),
            "pow" => (a.powf(v), v * a.powf(v - 1.0)),
            // clamp_min / clamp_max: NaN from either side; the gradient only strictly inside.
            "maximum" if a.is_nan() || v.is_nan() => (f64::NAN, 0.0),
            "maximum" => (a.max(v), (a > v) as u8 as f64),
            _ if a.is_nan() || v.is_nan() => (f64::NAN, 0.0),
            _ => (a.min(v), (a < v) as u8 as f64),
        })
        .unzip();
    let grad = local
        .iter()
        .enumerate()
        .map(|(i, l)| upstream(i) * l)
        .collect();
    Expected {
        shapes: vec![x.shape.clone()],
        values,
        indices: None,
        grad: Some(grad),
    }
}

/// Pieces of `x` along `d` with `sizes` (adding up to the dim's size).
fn pieces(x: &Nd, d: usize, sizes: &[usize]) -> Expected {
    let (mut shapes, mut from, mut start) = (Vec::new(), Vec::new(), 0);
    for &len in sizes {
        let mut s = x.shape.clone();
        s[d] = len;
        for at in indices(&s) {
            let mut i = at.clone();
            i[d] += start;
            from.push(flat(&x.shape, &i));
        }
        shapes.push(s);
        start += len;
    }
    copies(x, shapes, from)
}

fn view(x: &Nd, op: &Op) -> Option<Expected> {
    let r = x.rank();
    let reshaped = |shape: Vec<usize>| Some(copies(x, vec![shape], (0..x.data.len()).collect()));
    match op {
        Op::Expand(t) => {
            let skip = t.len().checked_sub(r)?;
            if (0..r).any(|k| x.shape[k] != t[skip + k] && x.shape[k] != 1) {
                return None;
            }
            let from = indices(t)
                .iter()
                .map(|at| {
                    let i: Vec<usize> = (0..r)
                        .map(|k| if x.shape[k] == 1 { 0 } else { at[skip + k] })
                        .collect();
                    flat(&x.shape, &i)
                })
                .collect();
            Some(copies(x, vec![t.clone()], from))
        }
        Op::SqueezeDim(d) => {
            let d = wrap(*d, r)?;
            let mut s = x.shape.clone();
            if r > 0 && s[d] == 1 {
                s.remove(d);
            }
            reshaped(s)
        }
        Op::Unsqueeze(d) => {
            let mut s = x.shape.clone();
            s.insert(wrap(*d, r + 1)?, 1);
            reshaped(s)
        }
        Op::Flatten(a, b) => {
            let (a, b) = (wrap(*a, r)?, wrap(*b, r)?);
            if r == 0 {
                return reshaped(vec![1]);
            }
            if a > b {
                return None;
            }
            let mut s = x.shape[..a].to_vec();
            s.push(x.shape[a..=b].iter().product());
            s.extend_from_slice(&x.shape[b + 1..]);
            reshaped(s)
        }
        Op::Chunk(n, d) | Op::Split(n, d) => {
            let d = wrap(*d, r)?;
            if r == 0 {
                return None;
            }
            let size = x.shape[d];
            let step = match op {
                Op::Chunk(..) if *n == 0 => return None,
                Op::Chunk(..) if size == 0 && *n > MAX_EMPTY_CHUNKS => return None,
                Op::Chunk(..) if size == 0 => return Some(pieces(x, d, &vec![0; *n])),
                Op::Chunk(..) => size.div_ceil(*n),
                _ if size == 0 => return Some(pieces(x, d, &[0])),
                _ if *n == 0 => return None,
                _ => *n,
            };
            let sizes: Vec<usize> = (0..size)
                .step_by(step)
                .map(|s| step.min(size - s))
                .collect();
            Some(pieces(x, d, &sizes))
        }
        Op::SplitSizes(sizes, d) => {
            let d = wrap(*d, r)?;
            let total = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s))?;
            if r == 0 || total != x.shape[d] {
                return None;
            }
            Some(pieces(x, d, sizes))
        }
        _ => unreachable!("not a view"),
    }
}

pub fn expected(case: &Case) -> Option<Expected> {
    let x = &case.x;
    let other = |s: &Vec<usize>| Nd::new(s, case.other.clone());
    let positive = |a: f64, b: f64| a > 0.0 && b > 0.0;
    match &case.op {
        Op::ExtremeDim(d, k, min) => extreme_dim(x, *d, *k, *min, true),
        Op::Argmin(d, k) => extreme_dim(x, *d, *k, true, false),
        Op::ExtremeAll(min) => extreme_all(x, *min),
        Op::Norm(p, dims, k) => norm(x, *p, dims, *k),
        Op::Compare(name, Some(s)) => elementwise_bool(x, &other(s), |a, b| compare(name, a, b)),
        Op::Compare(name, None) => {
            elementwise_bool(x, &Nd::new(&[], case.other.clone()), |a, b| {
                compare(name, a, b)
            })
        }
        Op::Logical(Some(s)) => elementwise_bool(x, &other(s), positive),
        Op::Logical(None) => {
            elementwise_bool(x, &Nd::new(&[], vec![0.0]), |a, _| a <= 0.0 || a.is_nan())
        }
        Op::Scalar(name, v) => Some(scalar_op(x, name, *v)),
        _ => view(x, &case.op),
    }
}
