//! An f64 reference for the optimizer-run fuzz target: PyTorch 2.15's single-tensor SGD, Adam and
//! AdamW (`torch/optim/sgd.py`, `adam.py`), its `clip_grad_norm_` (per-tensor norms, then the
//! norm of those) and `clip_grad_value_`, written element by element, and the hyper-parameters
//! kiln refuses.
//!
//! Invariants: every value is already rounded to the parameters' dtype where kiln stores it (the
//! parameters after each step); refusals follow kiln's rules, which are PyTorch's plus:
//! - a NaN learning rate, momentum or weight decay is refused (PyTorch's `lr < 0` lets NaN
//!   through);
//! - `set_lr` refuses a non-finite lr; `clip_grad_value_` a negative or NaN clip value;
//! - a parameter group that sets an option its algorithm has not got is refused.

/// Which algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algo {
    Sgd,
    Adam,
    AdamW,
}

/// Every hyper-parameter of the three algorithms (each uses its own).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hyper {
    pub lr: f64,
    pub momentum: f64,
    pub dampening: f64,
    pub weight_decay: f64,
    pub nesterov: bool,
    pub betas: (f64, f64),
    pub eps: f64,
    pub amsgrad: bool,
    pub maximize: bool,
}

/// A parameter group's overrides.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Overrides {
    pub lr: Option<f64>,
    pub momentum: Option<f64>,
    pub dampening: Option<f64>,
    pub weight_decay: Option<f64>,
    pub nesterov: Option<bool>,
    pub betas: Option<(f64, f64)>,
    pub eps: Option<f64>,
    pub amsgrad: Option<bool>,
    pub maximize: Option<bool>,
}

/// A gradient clip before a step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Clip {
    /// `clip_grad_norm_(params, max_norm, norm_type, error_if_nonfinite)`.
    Norm {
        max_norm: f64,
        norm_type: f64,
        error_if_nonfinite: bool,
    },
    /// `clip_coef_for`, then `step_with_grad_scale(coef)` (the gradients stay as they are).
    Fused { max_norm: f64, norm_type: f64 },
    /// `clip_grad_value_(params, clip_value)`.
    Value(f64),
}

fn nonneg(v: f64) -> bool {
    v >= 0.0
}

/// The options of a group, or `None` where kiln refuses them.
pub fn resolve(algo: Algo, d: &Hyper, o: &Overrides) -> Option<Hyper> {
    let h = Hyper {
        lr: o.lr.unwrap_or(d.lr),
        momentum: o.momentum.unwrap_or(d.momentum),
        dampening: o.dampening.unwrap_or(d.dampening),
        weight_decay: o.weight_decay.unwrap_or(d.weight_decay),
        nesterov: o.nesterov.unwrap_or(d.nesterov),
        betas: o.betas.unwrap_or(d.betas),
        eps: o.eps.unwrap_or(d.eps),
        amsgrad: o.amsgrad.unwrap_or(d.amsgrad),
        maximize: o.maximize.unwrap_or(d.maximize),
    };
    let ok = match algo {
        Algo::Sgd => {
            let foreign = o.betas.is_some() || o.eps.is_some() || o.amsgrad.is_some();
            !foreign
                && nonneg(h.lr)
                && nonneg(h.momentum)
                && nonneg(h.weight_decay)
                && (!h.nesterov || (h.momentum > 0.0 && h.dampening == 0.0))
        }
        Algo::Adam | Algo::AdamW => {
            let foreign = o.momentum.is_some() || o.dampening.is_some() || o.nesterov.is_some();
            let beta = |b: f64| (0.0..1.0).contains(&b);
            !foreign
                && nonneg(h.lr)
                && nonneg(h.eps)
                && nonneg(h.weight_decay)
                && beta(h.betas.0)
                && beta(h.betas.1)
        }
    };
    ok.then_some(h)
}

/// Per-parameter state: SGD's momentum buffer, Adam's moments and step count.
#[derive(Debug, Clone, Default)]
pub struct State {
    pub buf: Option<Vec<f64>>,
    pub m: Vec<f64>,
    pub v: Vec<f64>,
    pub vmax: Vec<f64>,
    pub step: u64,
}

/// One step of one parameter `p` with gradient `g` (already scaled), PyTorch's formulas.
pub fn step(algo: Algo, h: &Hyper, p: &mut [f64], g: &[f64], s: &mut State) {
    let n = p.len();
    let mut g: Vec<f64> = if h.maximize {
        g.iter().map(|x| -x).collect()
    } else {
        g.to_vec()
    };
    match algo {
        Algo::Sgd => {
            if h.weight_decay != 0.0 {
                (0..n).for_each(|i| g[i] += h.weight_decay * p[i]);
            }
            if h.momentum != 0.0 {
                let buf = match s.buf.take() {
                    None => g.clone(),
                    Some(b) => (0..n)
                        .map(|i| h.momentum * b[i] + (1.0 - h.dampening) * g[i])
                        .collect(),
                };
                if h.nesterov {
                    (0..n).for_each(|i| g[i] += h.momentum * buf[i]);
                } else {
                    g = buf.clone();
                }
                s.buf = Some(buf);
            }
            (0..n).for_each(|i| p[i] -= h.lr * g[i]);
        }
        Algo::Adam | Algo::AdamW => {
            if s.step == 0 {
                s.m = vec![0.0; n];
                s.v = vec![0.0; n];
                s.vmax = vec![0.0; n];
            }
            s.step += 1;
            if h.weight_decay != 0.0 {
                if algo == Algo::AdamW {
                    (0..n).for_each(|i| p[i] *= 1.0 - h.lr * h.weight_decay);
                } else {
                    (0..n).for_each(|i| g[i] += h.weight_decay * p[i]);
                }
            }
            let (b1, b2) = h.betas;
            let t = s.step as i32;
            let step_size = h.lr / (1.0 - b1.powi(t));
            let bc2_sqrt = (1.0 - b2.powi(t)).sqrt();
            for i in 0..n {
                // exp_avg.lerp_(grad, 1 - beta1), in PyTorch's two forms.
                let w = 1.0 - b1;
                s.m[i] = if w.abs() < 0.5 {
                    s.m[i] + w * (g[i] - s.m[i])
                } else {
                    g[i] - (g[i] - s.m[i]) * (1.0 - w)
                };
                s.v[i] = s.v[i] * b2 + (1.0 - b2) * g[i] * g[i];
                let v = if h.amsgrad {
                    s.vmax[i] = nan_max(s.vmax[i], s.v[i]);
                    s.vmax[i]
                } else {
                    s.v[i]
                };
                let denom = v.sqrt() / bc2_sqrt + h.eps;
                // addcdiv: the quotient first (a huge step over an infinite denominator is 0).
                p[i] -= step_size * (s.m[i] / denom);
            }
        }
    }
}

/// `torch.maximum`: NaN when either is.
fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// PyTorch's `torch.linalg.vector_norm(x, p)`, or `None` where it raises (the infinity and
/// negative norms of nothing).
fn vector_norm(x: &[f64], p: f64) -> Option<f64> {
    let abs = x.iter().map(|v| v.abs());
    if x.is_empty() && (p.is_infinite() || p < 0.0) {
        return None;
    }
    Some(if p == f64::INFINITY {
        abs.fold(f64::NEG_INFINITY, nan_max)
    } else if p == f64::NEG_INFINITY {
        abs.fold(f64::INFINITY, |m, v| {
            if v.is_nan() || m.is_nan() {
                f64::NAN
            } else {
                m.min(v)
            }
        })
    } else if p == 0.0 {
        abs.filter(|&v| v != 0.0).count() as f64
    } else {
        abs.map(|v| v.powf(p)).sum::<f64>().powf(1.0 / p)
    })
}

/// `clip_grad_norm_`'s total norm of `grads` (the norm of the per-tensor norms), `None` where
/// it is refused.
pub fn total_norm(grads: &[&[f64]], norm_type: f64) -> Option<f64> {
    if norm_type.is_nan() {
        return None;
    }
    if grads.is_empty() {
        return Some(0.0);
    }
    let norms = grads
        .iter()
        .map(|g| vector_norm(g, norm_type))
        .collect::<Option<Vec<f64>>>()?;
    vector_norm(&norms, norm_type)
}

/// `min(max_norm / (total + 1e-6), 1)`, NaN kept.
pub fn clip_coef(max_norm: f64, total: f64) -> f64 {
    let c = max_norm / (total + 1e-6);
    if c.is_nan() {
        c
    } else {
        c.min(1.0)
    }
}
