//! Adam and AdamW (with amsgrad and maximize), following PyTorch's `torch.optim.Adam`/`AdamW`
//! update step for step:
//!
//! ```text
//! g = grad (negated when maximize)
//! Adam:  g += weight_decay * p            AdamW:  p *= 1 - lr * weight_decay
//! m = m + (1 - beta1) * (g - m)           (lerp)
//! v = beta2 * v + (1 - beta2) * g * g
//! vmax = max(vmax, v)                     (amsgrad; the denominator then uses vmax)
//! denom = sqrt(v) / sqrt(1 - beta2^t) + eps
//! p = p - lr / (1 - beta1^t) * m / denom
//! ```
//!
//! Step counts are per parameter (a parameter frozen for a while keeps its own count), and the
//! bias corrections are computed in `f64` per parameter before the fused pass, which then runs
//! over fixed chunks of every parameter of the group in parallel.

use crate::access::OptFloat;
use crate::fused::{checked_grad, typed, typed_mut, CHUNK};
use crate::group::ParamGroup;
use crate::optimizer::{Algorithm, GroupOptions, Optim, ParamStateRecord, StepItem, TensorRecord};
use crate::{arg_err, Result};
use kiln_autograd::{DType, Parameter, Tensor};
use kiln_device::ops::multi_tensor::cpu::batch_ranges;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The options of an Adam/AdamW group (PyTorch's names and defaults).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamOptions {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// Decay rates of the first and second moment (default (0.9, 0.999)).
    pub betas: (f64, f64),
    /// Added to the denominator (default 1e-8).
    pub eps: f64,
    /// Weight decay: L2 penalty for Adam (default 0), decoupled for AdamW (default 1e-2).
    pub weight_decay: f64,
    /// Use the running maximum of the second moment (default false).
    pub amsgrad: bool,
    /// Maximize the objective (default false).
    pub maximize: bool,
}

impl Default for AdamOptions {
    fn default() -> Self {
        AdamOptions {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            amsgrad: false,
            maximize: false,
        }
    }
}

impl AdamOptions {
    /// AdamW's defaults (weight_decay 1e-2).
    pub fn adamw() -> Self {
        AdamOptions {
            weight_decay: 1e-2,
            ..Default::default()
        }
    }
    option_setter!(lr: f64, "Sets the learning rate.");
    option_setter!(betas: (f64, f64), "Sets the betas.");
    option_setter!(eps: f64, "Sets eps.");
    option_setter!(weight_decay: f64, "Sets the weight decay.");
    option_setter!(amsgrad: bool, "Sets amsgrad.");
    option_setter!(maximize: bool, "Sets maximize.");
}

impl GroupOptions for AdamOptions {
    fn resolve(&self, g: &ParamGroup) -> Result<Self> {
        for (name, set) in [
            ("momentum", g.momentum.is_some()),
            ("dampening", g.dampening.is_some()),
            ("nesterov", g.nesterov.is_some()),
        ] {
            if set {
                return Err(arg_err(
                    "Adam",
                    format!("a parameter group sets `{name}`, which Adam has not got; use betas"),
                ));
            }
        }
        let o = AdamOptions {
            lr: g.lr.unwrap_or(self.lr),
            betas: g.betas.unwrap_or(self.betas),
            eps: g.eps.unwrap_or(self.eps),
            weight_decay: g.weight_decay.unwrap_or(self.weight_decay),
            amsgrad: g.amsgrad.unwrap_or(self.amsgrad),
            maximize: g.maximize.unwrap_or(self.maximize),
        };
        o.validate()?;
        Ok(o)
    }
    fn validate(&self) -> Result<()> {
        let ge0 = |what: &str, v: f64| {
            if v.is_nan() || v < 0.0 {
                Err(arg_err(
                    "Adam",
                    format!("invalid {what} {v}; it must be >= 0"),
                ))
            } else {
                Ok(())
            }
        };
        ge0("learning rate", self.lr)?;
        ge0("eps", self.eps)?;
        ge0("weight_decay", self.weight_decay)?;
        for (i, b) in [self.betas.0, self.betas.1].into_iter().enumerate() {
            if !(0.0..1.0).contains(&b) {
                return Err(arg_err(
                    "Adam",
                    format!("invalid beta parameter at index {i}: {b}; betas must be in [0, 1)"),
                ));
            }
        }
        Ok(())
    }
    fn lr(&self) -> f64 {
        self.lr
    }
    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }
    fn momentum(&self) -> Option<f64> {
        Some(self.betas.0)
    }
    fn set_momentum(&mut self, m: f64) -> bool {
        self.betas.0 = m;
        true
    }
    fn betas(&self) -> Option<(f64, f64)> {
        Some(self.betas)
    }
    fn set_betas(&mut self, b: (f64, f64)) -> bool {
        self.betas = b;
        true
    }
}

/// Per-parameter Adam state.
#[derive(Debug)]
pub struct AdamState {
    /// Steps taken by this parameter.
    pub step: u64,
    /// First moment.
    pub exp_avg: Tensor,
    /// Second moment.
    pub exp_avg_sq: Tensor,
    /// Running maximum of the second moment (amsgrad only).
    pub max_exp_avg_sq: Option<Tensor>,
}

/// The Adam algorithm; `decoupled` selects AdamW's weight decay (use [`Adam`] / [`AdamW`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct AdamAlgorithm {
    decoupled: bool,
}

/// Adam (PyTorch's `torch.optim.Adam`).
pub type Adam = Optim<AdamAlgorithm>;
/// AdamW, Adam with decoupled weight decay (PyTorch's `torch.optim.AdamW`); it shares
/// [`Adam`]'s type, built with [`AdamW::new`].
pub struct AdamW;

impl Adam {
    /// Adam over `groups`; options a group leaves unset come from `defaults`.
    pub fn new(groups: Vec<ParamGroup>, defaults: AdamOptions) -> Result<Self> {
        Optim::with_algorithm(AdamAlgorithm { decoupled: false }, groups, defaults)
    }
}

impl AdamW {
    /// AdamW over `groups`; pass [`AdamOptions::adamw`] (weight_decay 1e-2) for PyTorch's
    /// defaults.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(groups: Vec<ParamGroup>, defaults: AdamOptions) -> Result<Adam> {
        Optim::with_algorithm(AdamAlgorithm { decoupled: true }, groups, defaults)
    }
}

/// Per-parameter scalars of one step, computed in f64 as PyTorch does in Python.
#[derive(Clone, Copy)]
pub(crate) struct StepScalars {
    pub(crate) step_size: f64,
    pub(crate) bc2_sqrt: f64,
}

pub(crate) struct Work {
    pub(crate) p: Tensor,
    pub(crate) g: Tensor,
    pub(crate) m: Tensor,
    pub(crate) v: Tensor,
    pub(crate) vmax: Option<Tensor>,
    pub(crate) k: StepScalars,
}

struct AdamChunk<'a, T> {
    p: &'a mut [T],
    g: &'a [T],
    m: &'a mut [T],
    v: &'a mut [T],
    vmax: Option<&'a mut [T]>,
    k: StepScalars,
}

fn adam_pass<T: OptFloat>(
    o: &AdamOptions,
    decoupled: bool,
    work: &[Work],
    scale: f64,
) -> Result<()> {
    let mut pw = work
        .iter()
        .map(|w| w.p.storage_write())
        .collect::<Result<Vec<_>, _>>()?;
    let gr: Vec<_> = work.iter().map(|w| w.g.storage_read()).collect();
    let mut mw = work
        .iter()
        .map(|w| w.m.storage_write())
        .collect::<Result<Vec<_>, _>>()?;
    let mut vw = work
        .iter()
        .map(|w| w.v.storage_write())
        .collect::<Result<Vec<_>, _>>()?;
    let mut xw = work
        .iter()
        .map(|w| w.vmax.as_ref().map(|x| x.storage_write()).transpose())
        .collect::<Result<Vec<_>, _>>()?;
    let mut chunks: Vec<AdamChunk<'_, T>> = Vec::new();
    let lanes = pw
        .iter_mut()
        .zip(&gr)
        .zip(mw.iter_mut())
        .zip(vw.iter_mut())
        .zip(xw.iter_mut());
    for (w, ((((pg, gg), mg), vg), xg)) in work.iter().zip(lanes) {
        let p = typed_mut::<T>(pg, &w.p)?;
        let g = typed::<T>(gg, &w.g)?;
        let m = typed_mut::<T>(mg, &w.m)?;
        let v = typed_mut::<T>(vg, &w.v)?;
        let mut xs: Vec<Option<&mut [T]>> = match (xg.as_mut(), &w.vmax) {
            (Some(x), Some(t)) => typed_mut::<T>(x, t)?.chunks_mut(CHUNK).map(Some).collect(),
            _ => Vec::new(),
        };
        xs.resize_with(p.len().div_ceil(CHUNK), || None);
        let pieces = p
            .chunks_mut(CHUNK)
            .zip(g.chunks(CHUNK))
            .zip(m.chunks_mut(CHUNK))
            .zip(v.chunks_mut(CHUNK));
        for ((((p, g), m), v), vmax) in pieces.zip(xs) {
            chunks.push(AdamChunk {
                p,
                g,
                m,
                v,
                vmax,
                k: w.k,
            });
        }
    }
    let c = AdamConsts {
        b1w: T::of(1.0 - o.betas.0),
        b2: T::of(o.betas.1),
        b2w: T::of(1.0 - o.betas.1),
        eps: T::of(o.eps),
        wd: T::of(o.weight_decay),
        decay: T::of(1.0 - o.lr * o.weight_decay),
        // Negating and multiplying by 1 are exact, so one multiply covers maximize and scale.
        gsm: T::of(if o.maximize { -scale } else { scale }),
    };
    let has_wd = o.weight_decay != 0.0;
    let (l2, decay) = (has_wd && !decoupled, has_wd && decoupled);
    let tasks = batch_ranges(chunks.iter().map(|c| c.p.len()), CHUNK);
    let mut it = chunks.into_iter();
    let batches: Vec<Vec<AdamChunk<'_, T>>> = tasks
        .into_iter()
        .map(|r| it.by_ref().take(r.len()).collect())
        .collect();
    kiln_device::threads::cpu_pool().install(|| {
        batches
            .into_par_iter()
            .flatten_iter()
            .for_each(|ch| match (l2, decay) {
                (true, _) => adam_chunk::<T, true, false>(&c, ch),
                (false, true) => adam_chunk::<T, false, true>(&c, ch),
                (false, false) => adam_chunk::<T, false, false>(&c, ch),
            });
    });
    Ok(())
}

/// The per-step constants of the update, rounded to the parameter dtype.
struct AdamConsts<T> {
    b1w: T,
    b2: T,
    b2w: T,
    eps: T,
    wd: T,
    decay: T,
    gsm: T,
}

/// The update of one chunk; `L2` adds weight decay to the gradient (Adam), `DECAY` shrinks the
/// parameter first (AdamW). Branch-free per element so the loop vectorises.
#[inline(always)]
fn adam_chunk<T: OptFloat, const L2: bool, const DECAY: bool>(
    c: &AdamConsts<T>,
    ch: AdamChunk<'_, T>,
) {
    let AdamChunk {
        p,
        g,
        m,
        v,
        vmax,
        k,
    } = ch;
    let (step, bc2) = (T::of(-k.step_size), T::of(k.bc2_sqrt));
    let moments = |p: &mut T, g: T, m: &mut T, v: &mut T| {
        let mut d = g * c.gsm;
        if DECAY {
            *p = *p * c.decay;
        }
        if L2 {
            d = d + *p * c.wd;
        }
        *m = *m + c.b1w * (d - *m);
        *v = *v * c.b2 + c.b2w * d * d;
    };
    match vmax {
        None => {
            for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
                moments(p, g, m, v);
                let denom = v.sqrt() / bc2 + c.eps;
                *p = *p + step * (*m / denom);
            }
        }
        Some(x) => {
            let lanes = p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut());
            for ((((p, &g), m), v), x) in lanes.zip(x.iter_mut()) {
                moments(p, g, m, v);
                // torch.maximum: NaN wins.
                if *v > *x || v.is_nan() {
                    *x = *v;
                }
                let denom = x.sqrt() / bc2 + c.eps;
                *p = *p + step * (*m / denom);
            }
        }
    }
}

impl Algorithm for AdamAlgorithm {
    type Options = AdamOptions;
    type State = AdamState;

    fn name(&self) -> &'static str {
        if self.decoupled {
            "AdamW"
        } else {
            "Adam"
        }
    }

    fn init_state(&self, o: &AdamOptions, p: &Parameter) -> Result<AdamState> {
        Ok(AdamState {
            step: 0,
            exp_avg: p.zeros_like()?,
            exp_avg_sq: p.zeros_like()?,
            max_exp_avg_sq: if o.amsgrad {
                Some(p.zeros_like()?)
            } else {
                None
            },
        })
    }

    fn step_group(
        &self,
        o: &AdamOptions,
        items: Vec<StepItem<'_, AdamState>>,
        scale: f64,
    ) -> Result<()> {
        // Slots: f32 on the host, f64 on the host, CUDA (f32).
        let mut by_dtype: [Vec<Work>; 3] = [Vec::new(), Vec::new(), Vec::new()];
        for it in items {
            let on_cuda = !it.param.device().is_cpu();
            let g = if on_cuda {
                crate::adam_cuda::checked_cuda_grad(self.name(), &it)?
            } else {
                checked_grad(self.name(), &it)?
            };
            let s = &mut *it.state;
            if o.amsgrad && s.max_exp_avg_sq.is_none() {
                s.max_exp_avg_sq = Some(it.param.zeros_like()?);
            }
            s.step += 1;
            let t = s.step as f64;
            let bc1 = 1.0 - o.betas.0.powf(t);
            let bc2 = 1.0 - o.betas.1.powf(t);
            let slot = if on_cuda {
                2
            } else {
                usize::from(it.param.dtype() == DType::F64)
            };
            by_dtype[slot].push(Work {
                p: it.param.tensor().clone(),
                g,
                m: s.exp_avg.clone(),
                v: s.exp_avg_sq.clone(),
                vmax: s.max_exp_avg_sq.clone().filter(|_| o.amsgrad),
                k: StepScalars {
                    step_size: o.lr / bc1,
                    bc2_sqrt: bc2.sqrt(),
                },
            });
        }
        adam_pass::<f32>(o, self.decoupled, &by_dtype[0], scale)?;
        adam_pass::<f64>(o, self.decoupled, &by_dtype[1], scale)?;
        crate::adam_cuda::adam_step_cuda(o, self.decoupled, &by_dtype[2], scale)
    }

    fn save_state(&self, s: &AdamState) -> Result<ParamStateRecord> {
        let mut buffers = BTreeMap::new();
        buffers.insert("exp_avg".into(), TensorRecord::from_tensor(&s.exp_avg)?);
        buffers.insert(
            "exp_avg_sq".into(),
            TensorRecord::from_tensor(&s.exp_avg_sq)?,
        );
        if let Some(x) = &s.max_exp_avg_sq {
            buffers.insert("max_exp_avg_sq".into(), TensorRecord::from_tensor(x)?);
        }
        Ok(ParamStateRecord {
            step: s.step,
            buffers,
        })
    }

    fn load_state(&self, r: &ParamStateRecord, p: &Parameter) -> Result<AdamState> {
        let get = |k: &str| {
            r.buffers
                .get(k)
                .ok_or_else(|| {
                    crate::Error::StateDict(format!(
                        "parameter state lacks `{k}`; load a state dict saved by Adam/AdamW"
                    ))
                })
                .and_then(|b| b.to_tensor_like(p, k))
        };
        Ok(AdamState {
            step: r.step,
            exp_avg: get("exp_avg")?,
            exp_avg_sq: get("exp_avg_sq")?,
            max_exp_avg_sq: r
                .buffers
                .get("max_exp_avg_sq")
                .map(|b| b.to_tensor_like(p, "max_exp_avg_sq"))
                .transpose()?,
        })
    }
}
