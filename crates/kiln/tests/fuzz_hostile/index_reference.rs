//! The f64 reference of the indexing target ([`crate::indexing`]), written from PyTorch 2.15's
//! definitions and checked against it by hand: `gather`, `scatter` / `scatter_add`,
//! `embedding` (with `padding_idx`), `topk`, `masked_fill`, `where`, `cat`, `stack` and
//! `argmax`. Each returns `None` where PyTorch raises.
//!
//! Every one of these ops is linear in its float operands, so the reference writes each output
//! element as a sum of operand elements or a constant ([`Linear`]). The value is that sum;
//! PyTorch's gradient is its transpose, except where PyTorch's backward rule says otherwise,
//! which [`Linear::grad_terms`] writes: `scatter` hands every covered `src` element the
//! gradient at its target even when a later duplicate overwrote it, and `embedding` gives the
//! `padding_idx` row none.
//!
//! PyTorch's rules kept here: a 0-d tensor counts as one element of rank 1 in the rank and dim
//! checks of `gather`, `scatter`, `topk` and `argmax`; an empty index skips `gather`'s and
//! `scatter`'s shape checks; out-of-place `masked_fill` broadcasts the tensor with the mask;
//! `cat` skips 1-D empty tensors (the legacy `torch.tensor([])`); `topk` ranks NaN above every
//! number and takes equal values in index order; `argmax` takes the first NaN, else the first
//! maximum. Where kiln deliberately differs: `topk` of a 0-d tensor with `k = 0` is refused
//! (PyTorch returns the element anyway).

use crate::reference::{broadcast_shape, flat, indices, lines, wrap, Nd};

/// An integer tensor (indices), row-major.
#[derive(Debug, Clone)]
pub struct IntNd {
    pub shape: Vec<usize>,
    pub data: Vec<i64>,
}

/// A bool tensor (masks, conditions), row-major.
#[derive(Debug, Clone)]
pub struct BoolNd {
    pub shape: Vec<usize>,
    pub data: Vec<bool>,
}

/// Output element `i` is `Σ operands[o][j]` over `terms[i]`'s `(o, j)`, or `constant[i]` where
/// it has no terms.
#[derive(Debug, Clone, Default)]
pub struct Linear {
    pub shape: Vec<usize>,
    pub terms: Vec<Vec<(usize, usize)>>,
    pub constant: Vec<f64>,
    /// The terms PyTorch's backward sends output `i`'s gradient to, where they are not
    /// `terms` (see the module docs).
    pub grad_terms: Option<Vec<Vec<(usize, usize)>>>,
}

impl Linear {
    fn new(shape: &[usize]) -> Linear {
        let n = shape.iter().product();
        Linear {
            shape: shape.to_vec(),
            terms: vec![Vec::new(); n],
            constant: vec![0.0; n],
            grad_terms: None,
        }
    }

    /// The output's values.
    pub fn values(&self, operands: &[Nd]) -> Vec<f64> {
        self.terms
            .iter()
            .zip(&self.constant)
            .map(|(t, &c)| {
                // A copy keeps its sign of zero: no `0.0 +` in front of it.
                let terms = t.iter().map(|&(o, j)| operands[o].data[j]);
                terms.reduce(|a, b| a + b).unwrap_or(c)
            })
            .collect()
    }

    /// The gradient of `Σ g_i · output_i` with respect to operand `o` of `len` elements.
    pub fn gradient(&self, o: usize, len: usize, g: impl Fn(usize) -> f64) -> Vec<f64> {
        let mut out = vec![0.0; len];
        for (i, terms) in self
            .grad_terms
            .as_ref()
            .unwrap_or(&self.terms)
            .iter()
            .enumerate()
        {
            for &(p, j) in terms {
                if p == o {
                    out[j] += g(i);
                }
            }
        }
        out
    }
}

/// What a call returns: float values, indices (`topk`, `argmax`), or both.
#[derive(Debug, Clone)]
pub struct Expected {
    pub values: Option<Linear>,
    pub indices: Option<IntNd>,
}

/// `shape`, with a 0-d shape read as `[1]` (PyTorch's `ensure_nonempty_dim`).
fn nonempty(shape: &[usize]) -> Vec<usize> {
    if shape.is_empty() {
        vec![1]
    } else {
        shape.to_vec()
    }
}

/// The index's value as a position below `size`, if it is one.
fn position(i: i64, size: usize) -> Option<usize> {
    (i >= 0 && (i as u64) < size as u64).then_some(i as usize)
}

pub fn gather(x: &Nd, dim: isize, index: &IntNd) -> Option<Expected> {
    let d = wrap(dim, x.shape.len())?;
    let mut out = Linear::new(&index.shape);
    if !index.data.is_empty() {
        let (xs, is) = (nonempty(&x.shape), nonempty(&index.shape));
        if xs.len() != is.len() || (0..xs.len()).any(|k| k != d && is[k] > xs[k]) {
            return None;
        }
        for (i, at) in indices(&is).iter().enumerate() {
            let mut from = at.clone();
            from[d] = position(index.data[i], xs[d])?;
            out.terms[i] = vec![(0, flat(&xs, &from))];
        }
    }
    Some(Expected {
        values: Some(out),
        indices: None,
    })
}

/// `scatter` (`add`: `scatter_add`) of operand 1 (`src`) into operand 0 (`x`).
pub fn scatter(x: &Nd, dim: isize, index: &IntNd, src: &Nd, add: bool) -> Option<Expected> {
    let d = wrap(dim, x.shape.len())?;
    let mut out = Linear::new(&x.shape);
    for (i, t) in out.terms.iter_mut().enumerate() {
        *t = vec![(0, i)];
    }
    let mut grad = out.terms.clone();
    if !index.data.is_empty() {
        let (xs, is, ss) = (
            nonempty(&x.shape),
            nonempty(&index.shape),
            nonempty(&src.shape),
        );
        if xs.len() != is.len() || ss.len() != is.len() {
            return None;
        }
        if (0..xs.len()).any(|k| is[k] > ss[k] || (k != d && is[k] > xs[k])) {
            return None;
        }
        for (i, at) in indices(&is).iter().enumerate() {
            let mut to = at.clone();
            to[d] = position(index.data[i], xs[d])?;
            let (to, from) = (flat(&xs, &to), (1, flat(&ss, at)));
            if add {
                out.terms[to].push(from);
            } else {
                out.terms[to] = vec![from];
                // Written over: `x` gets no gradient here, every `src` element aimed here does.
                grad[to].retain(|&(o, _)| o != 0);
            }
            grad[to].push(from);
        }
    }
    if !add {
        out.grad_terms = Some(grad);
    }
    Some(Expected {
        values: Some(out),
        indices: None,
    })
}

/// `F.embedding(indices, weight, padding_idx)` with the weight as operand 0.
pub fn embedding(weight: &Nd, index: &IntNd, padding: Option<i64>) -> Option<Expected> {
    let [num, width] = weight.shape[..] else {
        return None;
    };
    let padding = match padding {
        Some(p) if p < 0 => Some(position(p + num as i64, num)?),
        Some(p) => Some(position(p, num)?),
        None => None,
    };
    let mut shape = index.shape.clone();
    shape.push(width);
    let mut out = Linear::new(&shape);
    let mut grad = out.terms.clone();
    for (i, &row) in index.data.iter().enumerate() {
        let row = position(row, num)?;
        for c in 0..width {
            out.terms[i * width + c] = vec![(0, row * width + c)];
            if Some(row) != padding {
                grad[i * width + c] = vec![(0, row * width + c)];
            }
        }
    }
    out.grad_terms = Some(grad);
    Some(Expected {
        values: Some(out),
        indices: None,
    })
}

/// `a` ranks before `b` in `topk` (`largest`) or `argmax`: NaN first, equal values in order.
fn better(a: f64, b: f64, largest: bool) -> bool {
    match (a.is_nan(), b.is_nan()) {
        (true, _) => !b.is_nan() && largest,
        (false, true) => !largest,
        _ if largest => a > b,
        _ => a < b,
    }
}

pub fn topk(x: &Nd, k: usize, dim: isize, largest: bool) -> Option<Expected> {
    let d = wrap(dim, x.shape.len())?;
    let xs = nonempty(&x.shape);
    if k > xs[d] || (x.shape.is_empty() && k == 0) {
        return None;
    }
    let mut shape = xs.clone();
    shape[d] = k;
    let mut out = Linear::new(&shape);
    let mut picks = vec![0i64; out.terms.len()];
    let out_lines = lines(&shape, d);
    for (line, out_line) in lines(&x.shape, d).iter().zip(&out_lines) {
        let mut order: Vec<usize> = (0..line.len()).collect();
        // Insertion by `better`, stable: equal values keep index order.
        for i in 1..order.len() {
            let mut j = i;
            while j > 0 && better(x.data[line[order[j]]], x.data[line[order[j - 1]]], largest) {
                order.swap(j, j - 1);
                j -= 1;
            }
        }
        for (slot, &o) in out_line.iter().zip(&order) {
            out.terms[*slot] = vec![(0, line[o])];
            picks[*slot] = o as i64;
        }
    }
    if x.shape.is_empty() {
        shape.clear();
        out.shape.clear();
    }
    Some(Expected {
        values: Some(out),
        indices: Some(IntNd { shape, data: picks }),
    })
}

pub fn argmax(x: &Nd, dim: isize, keepdim: bool) -> Option<Expected> {
    let d = wrap(dim, x.shape.len())?;
    let xs = nonempty(&x.shape);
    if xs[d] == 0 {
        return None;
    }
    let data = lines(&x.shape, d)
        .iter()
        .map(|line| {
            let mut best = 0;
            for k in 1..line.len() {
                if better(x.data[line[k]], x.data[line[best]], true) {
                    best = k;
                }
            }
            best as i64
        })
        .collect();
    let mut shape = x.shape.clone();
    if !shape.is_empty() {
        if keepdim {
            shape[d] = 1;
        } else {
            shape.remove(d);
        }
    }
    Some(Expected {
        values: None,
        indices: Some(IntNd { shape, data }),
    })
}

/// Where position `out` of a broadcast `shape` reads from an operand of `from`'s shape.
fn broadcast_flat(from: &[usize], shape: &[usize], out: &[usize]) -> usize {
    let skip = shape.len() - from.len();
    let at: Vec<usize> = (0..from.len())
        .map(|k| if from[k] == 1 { 0 } else { out[skip + k] })
        .collect();
    flat(from, &at)
}

pub fn masked_fill(x: &Nd, mask: &BoolNd, value: f64) -> Option<Expected> {
    let shape = broadcast_shape(&x.shape, &mask.shape)?;
    let mut out = Linear::new(&shape);
    for (i, at) in indices(&shape).iter().enumerate() {
        if mask.data[broadcast_flat(&mask.shape, &shape, at)] {
            out.constant[i] = value;
        } else {
            out.terms[i] = vec![(0, broadcast_flat(&x.shape, &shape, at))];
        }
    }
    Some(Expected {
        values: Some(out),
        indices: None,
    })
}

/// `where(cond, x, other)`: operand 0 where `cond`, else operand 1.
pub fn where_(cond: &BoolNd, x: &Nd, other: &Nd) -> Option<Expected> {
    let shape = broadcast_shape(&broadcast_shape(&x.shape, &other.shape)?, &cond.shape)?;
    let mut out = Linear::new(&shape);
    for (i, at) in indices(&shape).iter().enumerate() {
        out.terms[i] = vec![match cond.data[broadcast_flat(&cond.shape, &shape, at)] {
            true => (0, broadcast_flat(&x.shape, &shape, at)),
            false => (1, broadcast_flat(&other.shape, &shape, at)),
        }];
    }
    Some(Expected {
        values: Some(out),
        indices: None,
    })
}

/// `cat(operands, dim)` (`stack`: `stack(operands, dim)`).
pub fn join(parts: &[Nd], dim: isize, stack: bool) -> Option<Expected> {
    let first = parts.first()?;
    if stack {
        if parts.iter().any(|p| p.shape != first.shape) {
            return None;
        }
        let d = wrap(dim, first.shape.len() + 1)?;
        let mut shape = first.shape.clone();
        shape.insert(d, 1);
        let unsqueezed: Vec<Nd> = parts
            .iter()
            .map(|p| Nd {
                shape: shape.clone(),
                data: p.data.clone(),
            })
            .collect();
        return join(&unsqueezed, d as isize, false);
    }
    if parts.iter().any(|p| p.shape.is_empty()) {
        return None;
    }
    let legacy = |p: &Nd| p.shape == [0];
    let kept: Vec<usize> = (0..parts.len()).filter(|&i| !legacy(&parts[i])).collect();
    let Some(&lead) = kept.first() else {
        return Some(Expected {
            values: Some(Linear::new(&[0])),
            indices: None,
        });
    };
    let rank = parts[lead].shape.len();
    let d = wrap(dim, rank)?;
    let mut shape = parts[lead].shape.clone();
    shape[d] = 0;
    for &i in &kept {
        let s = &parts[i].shape;
        if s.len() != rank || (0..rank).any(|k| k != d && s[k] != shape[k]) {
            return None;
        }
        shape[d] += s[d];
    }
    let mut out = Linear::new(&shape);
    let mut offset = 0;
    for &i in &kept {
        let s = &parts[i].shape;
        for (j, at) in indices(s).iter().enumerate() {
            let mut to = at.clone();
            to[d] += offset;
            out.terms[flat(&shape, &to)] = vec![(i, j)];
        }
        offset += s[d];
    }
    Some(Expected {
        values: Some(out),
        indices: None,
    })
}
