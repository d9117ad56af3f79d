//! A small f64 reference for the random-op fuzz target: row-major n-d arrays and PyTorch's rules
//! for broadcasting, dims (negative wrap, duplicates refused), reductions, matmul, views,
//! softmax and index_select. Each function returns `None` where PyTorch raises, so the fuzzer
//! knows which calls must be refused.
//!
//! Invariant: `data.len()` is the product of `shape` (every constructor keeps it).

#[derive(Debug, Clone, PartialEq)]
pub struct Nd {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

/// Row-major strides of `shape`.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Every multi-index of `shape`, in row-major order.
pub fn indices(shape: &[usize]) -> Vec<Vec<usize>> {
    let n: usize = shape.iter().product();
    let st = strides(shape);
    (0..n)
        .map(|flat| {
            st.iter()
                .zip(shape)
                .map(|(&s, &d)| (flat / s) % d.max(1))
                .collect()
        })
        .collect()
}

/// The row-major position of multi-index `at` in `shape`.
pub fn flat(shape: &[usize], at: &[usize]) -> usize {
    strides(shape).iter().zip(at).map(|(s, i)| s * i).sum()
}

/// The lines of a tensor of `shape` along dim `d` (a 0-d tensor is one line of one element),
/// each as the row-major positions of its elements in order, the lines in row-major order of
/// the other dims.
pub fn lines(shape: &[usize], d: usize) -> Vec<Vec<usize>> {
    let s = if shape.is_empty() {
        vec![1]
    } else {
        shape.to_vec()
    };
    let mut outer = s.clone();
    outer[d] = 1;
    indices(&outer)
        .iter()
        .map(|at| {
            (0..s[d])
                .map(|k| {
                    let mut i = at.clone();
                    i[d] = k;
                    flat(&s, &i)
                })
                .collect()
        })
        .collect()
}

impl Nd {
    pub fn new(shape: &[usize], data: Vec<f64>) -> Nd {
        assert_eq!(shape.iter().product::<usize>(), data.len());
        Nd {
            shape: shape.to_vec(),
            data,
        }
    }

    fn from_fn(shape: &[usize], f: impl Fn(&[usize]) -> f64) -> Nd {
        let data = indices(shape).iter().map(|i| f(i)).collect();
        Nd::new(shape, data)
    }

    pub fn get(&self, idx: &[usize]) -> f64 {
        let st = strides(&self.shape);
        self.data[idx.iter().zip(&st).map(|(i, s)| i * s).sum::<usize>()]
    }

    pub fn map(&self, f: impl Fn(f64) -> f64) -> Nd {
        Nd::new(&self.shape, self.data.iter().map(|&x| f(x)).collect())
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }
}

/// PyTorch's dim wrapping: `-rank..rank`; a 0-d tensor takes 0 and -1.
pub fn wrap(dim: isize, rank: usize) -> Option<usize> {
    let r = rank.max(1) as isize;
    let d = if dim < 0 { dim + r } else { dim };
    (0..r).contains(&d).then_some(d as usize)
}

/// Wrapped reduction dims; `None` for one out of range or named twice.
pub fn wrap_dims(dims: &[isize], rank: usize) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for &d in dims {
        let w = wrap(d, rank)?;
        if out.contains(&w) {
            return None;
        }
        out.push(w);
    }
    Some(out)
}

pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let at = |s: &[usize], i: usize| {
        if i + s.len() >= n {
            s[i + s.len() - n]
        } else {
            1
        }
    };
    (0..n)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

fn broadcast_get(x: &Nd, out: &[usize]) -> f64 {
    let skip = out.len() - x.rank();
    let idx: Vec<usize> = x
        .shape
        .iter()
        .enumerate()
        .map(|(i, &d)| if d == 1 { 0 } else { out[skip + i] })
        .collect();
    x.get(&idx)
}

pub fn binary(a: &Nd, b: &Nd, f: impl Fn(f64, f64) -> f64) -> Option<Nd> {
    let shape = broadcast_shape(&a.shape, &b.shape)?;
    Some(Nd::from_fn(&shape, |i| {
        f(broadcast_get(a, i), broadcast_get(b, i))
    }))
}

/// A reduction over `dims` (already wrapped); `fold` sees the reduced values in order.
pub fn reduce(x: &Nd, dims: &[usize], keepdim: bool, fold: impl Fn(&[f64]) -> f64) -> Nd {
    let kept: Vec<usize> = x
        .shape
        .iter()
        .enumerate()
        .map(|(i, &d)| if dims.contains(&i) { 1 } else { d })
        .collect();
    let sub: Vec<usize> = x
        .shape
        .iter()
        .enumerate()
        .map(|(i, &d)| if dims.contains(&i) { d } else { 1 })
        .collect();
    let out = Nd::from_fn(&kept, |o| {
        let values: Vec<f64> = indices(&sub)
            .iter()
            .map(|s| {
                let idx: Vec<usize> = o.iter().zip(s).map(|(a, b)| a + b).collect();
                x.get(&idx)
            })
            .collect();
        fold(&values)
    });
    if keepdim || x.rank() == 0 {
        return out;
    }
    let shape: Vec<usize> = (0..x.rank())
        .filter(|i| !dims.contains(i))
        .map(|i| x.shape[i])
        .collect();
    Nd::new(&shape, out.data)
}

pub fn matmul(a: &Nd, b: &Nd) -> Option<Nd> {
    match (a.rank(), b.rank()) {
        (2, 2) if a.shape[1] == b.shape[0] => {
            let (m, k, n) = (a.shape[0], a.shape[1], b.shape[1]);
            Some(Nd::from_fn(&[m, n], |i| {
                (0..k).map(|t| a.get(&[i[0], t]) * b.get(&[t, i[1]])).sum()
            }))
        }
        (3, 3) if a.shape[0] == b.shape[0] && a.shape[2] == b.shape[1] => {
            let (bs, m, k, n) = (a.shape[0], a.shape[1], a.shape[2], b.shape[2]);
            Some(Nd::from_fn(&[bs, m, n], |i| {
                (0..k)
                    .map(|t| a.get(&[i[0], i[1], t]) * b.get(&[i[0], t, i[2]]))
                    .sum()
            }))
        }
        _ => None,
    }
}

pub fn permute(x: &Nd, perm: &[isize]) -> Option<Nd> {
    if perm.len() != x.rank() {
        return None;
    }
    let p = wrap_dims(perm, x.rank())?;
    let shape: Vec<usize> = p.iter().map(|&d| x.shape[d]).collect();
    Some(Nd::from_fn(&shape, |o| {
        let mut idx = vec![0; x.rank()];
        for (out_dim, &in_dim) in p.iter().enumerate() {
            idx[in_dim] = o[out_dim];
        }
        x.get(&idx)
    }))
}

pub fn narrow(x: &Nd, dim: isize, start: usize, len: usize) -> Option<Nd> {
    if x.rank() == 0 {
        return None;
    }
    let d = wrap(dim, x.rank())?;
    if start.checked_add(len)? > x.shape[d] {
        return None;
    }
    let mut shape = x.shape.clone();
    shape[d] = len;
    Some(Nd::from_fn(&shape, |o| {
        let mut idx = o.to_vec();
        idx[d] += start;
        x.get(&idx)
    }))
}

pub fn select(x: &Nd, dim: isize, index: isize) -> Option<Nd> {
    if x.rank() == 0 {
        return None;
    }
    let d = wrap(dim, x.rank())?;
    let size = x.shape[d] as isize;
    let i = if index < 0 { index + size } else { index };
    if !(0..size).contains(&i) {
        return None;
    }
    let one = narrow(x, d as isize, i as usize, 1)?;
    let mut shape = x.shape.clone();
    shape.remove(d);
    Some(Nd::new(&shape, one.data))
}

/// The shape `reshape` gives, with at most one -1 inferred; `None` where PyTorch refuses.
pub fn reshape_shape(numel: usize, target: &[isize]) -> Option<Vec<usize>> {
    let inferred = target.iter().filter(|&&d| d == -1).count();
    if inferred > 1 || target.iter().any(|&d| d < -1) {
        return None;
    }
    let known: usize = target
        .iter()
        .filter(|&&d| d >= 0)
        .map(|&d| d as usize)
        .product();
    let shape: Vec<usize> = target
        .iter()
        .map(|&d| {
            if d == -1 {
                numel.checked_div(known).unwrap_or(usize::MAX)
            } else {
                d as usize
            }
        })
        .collect();
    (!shape.contains(&usize::MAX) && shape.iter().product::<usize>() == numel).then_some(shape)
}

pub fn softmax(x: &Nd, dim: isize, log: bool) -> Option<Nd> {
    let d = wrap(dim, x.rank())?;
    if x.rank() == 0 {
        return Some(x.map(|_| if log { 0.0 } else { 1.0 }));
    }
    let max = reduce(x, &[d], true, |v| {
        v.iter().cloned().fold(f64::MIN, f64::max)
    });
    let shifted = binary(x, &max, |a, m| a - m)?;
    let sum = reduce(&shifted.map(f64::exp), &[d], true, |v| v.iter().sum());
    if log {
        binary(&shifted, &sum, |a, s| a - s.ln())
    } else {
        binary(&shifted, &sum, |a, s| a.exp() / s)
    }
}

pub fn index_select(x: &Nd, dim: isize, index: &[i64]) -> Option<Nd> {
    let d = wrap(dim, x.rank())?;
    let size = if x.rank() == 0 { 1 } else { x.shape[d] };
    if index.iter().any(|&i| i < 0 || i as usize >= size) {
        return None;
    }
    if x.rank() == 0 {
        return (index.len() == 1).then(|| x.clone());
    }
    let mut shape = x.shape.clone();
    shape[d] = index.len();
    Some(Nd::from_fn(&shape, |o| {
        let mut idx = o.to_vec();
        idx[d] = index[o[d]] as usize;
        x.get(&idx)
    }))
}

/// `erf` by its Taylor series (the test's values lie in [-3, 3], where 80 terms reach f64's
/// precision to a few ulps).
pub fn erf(x: f64) -> f64 {
    let (mut term, mut sum) = (x, x);
    for n in 1..80 {
        term *= -x * x / n as f64;
        sum += term / (2 * n + 1) as f64;
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

/// `tril` (`upper`: `triu`) of the last two dims, keeping `j - i <= diag` (`>= diag`); `None`
/// below two dims, where PyTorch raises.
pub fn triangle(x: &Nd, diag: i64, upper: bool) -> Option<Nd> {
    let r = x.rank();
    if r < 2 {
        return None;
    }
    Some(Nd::from_fn(&x.shape, |i| {
        let off = i[r - 1] as i64 - i[r - 2] as i64;
        let keep = if upper { off >= diag } else { off <= diag };
        if keep {
            x.get(i)
        } else {
            0.0
        }
    }))
}

/// The gradient of `Σ w_o · extreme(x over dims)_o` (`amax`, or `amin` when `min`) that PyTorch
/// gives: each output's weight split evenly among the elements that reach its extreme.
pub fn extreme_gradient(x: &Nd, dims: &[usize], min: bool, w: impl Fn(usize) -> f64) -> Vec<f64> {
    let pick = |v: &[f64]| {
        let f = if min { f64::min } else { f64::max };
        v.iter().cloned().reduce(f).unwrap_or(f64::NAN)
    };
    let kept = reduce(x, dims, true, pick);
    let kept_strides = strides(&kept.shape);
    let slot = |i: &[usize]| -> usize {
        i.iter()
            .enumerate()
            .map(|(d, &v)| {
                if dims.contains(&d) {
                    0
                } else {
                    v * kept_strides[d]
                }
            })
            .sum()
    };
    let all = indices(&x.shape);
    let mut ties = vec![0usize; kept.data.len()];
    for i in &all {
        if x.get(i) == kept.data[slot(i)] {
            ties[slot(i)] += 1;
        }
    }
    all.iter()
        .map(|i| {
            let o = slot(i);
            if x.get(i) == kept.data[o] {
                w(o) / ties[o] as f64
            } else {
                0.0
            }
        })
        .collect()
}
