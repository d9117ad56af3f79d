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
//! bias corrections are computed in `f64` per parameter before the fused pass: one
//! `kiln_device::ops::multi_tensor::adam_step` per device over every parameter of the group
//! (fixed chunks in parallel on the CPU, one launch on CUDA).
//!
//! Invariants: options are validated when a group is built or changed; every gradient arrives
//! checked (`GroupedOptimizer` checks the whole group before any state changes); the update
//! itself is kiln-device's,
//! bit for bit the formula above rounded in the parameter dtype.

use crate::group::{IntoParamGroups, ParamGroup};
use crate::operands::by_device;
use crate::optimizer::{Algorithm, GroupOptions, GroupedOptimizer, StepItem};
use crate::state_dict::{ParamStateRecord, TensorRecord};
use crate::{arg_err, Result};
use kiln_autograd::{Parameter, Tensor};
use kiln_device::ops::multi_tensor::{self, AdamHyper, AdamOperands, AdamStepScalars};
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
                    format!("invalid {what} {v:?}; it must be >= 0"),
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
                    format!("invalid beta parameter at index {i}: {b:?}; betas must be in [0, 1)"),
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
pub type Adam = GroupedOptimizer<AdamAlgorithm>;
/// AdamW, Adam with decoupled weight decay (PyTorch's `torch.optim.AdamW`); it shares
/// [`Adam`]'s type, built with [`AdamW::new`].
pub struct AdamW;

impl Adam {
    /// Adam over `groups`; options a group leaves unset come from `defaults`.
    pub fn new(groups: impl IntoParamGroups, defaults: AdamOptions) -> Result<Self> {
        let groups = groups.into_param_groups();
        GroupedOptimizer::with_algorithm(AdamAlgorithm { decoupled: false }, groups, defaults)
    }
}

impl AdamW {
    /// AdamW over `groups`; pass [`AdamOptions::adamw`] (weight_decay 1e-2) for PyTorch's
    /// defaults.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(groups: impl IntoParamGroups, defaults: AdamOptions) -> Result<Adam> {
        let groups = groups.into_param_groups();
        GroupedOptimizer::with_algorithm(AdamAlgorithm { decoupled: true }, groups, defaults)
    }
}

/// One parameter of this step: its tensors (borrowed from the parameter and its state) and its
/// bias corrections (computed in f64 per parameter, as PyTorch does in Python).
struct Work<'a> {
    p: &'a Tensor,
    g: Tensor,
    m: &'a Tensor,
    v: &'a Tensor,
    vmax: Option<&'a Tensor>,
    k: AdamStepScalars,
}

/// One fused step over `work` (all on one device) through kiln-device's multi-tensor Adam.
fn adam_pass(op: &'static str, hyper: &AdamHyper, work: &[Work<'_>]) -> Result<()> {
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
    let guards = pw
        .iter_mut()
        .zip(&gr)
        .zip(mw.iter_mut())
        .zip(vw.iter_mut())
        .zip(xw.iter_mut());
    let mut list: Vec<AdamOperands<'_>> = work
        .iter()
        .zip(guards)
        .map(|(w, ((((pg, gg), mg), vg), xg))| AdamOperands {
            param: (&mut **pg, w.p.layout()),
            grad: (&**gg, w.g.layout()),
            exp_avg: (&mut **mg, w.m.layout()),
            exp_avg_sq: (&mut **vg, w.v.layout()),
            max_exp_avg_sq: match (xg.as_mut(), &w.vmax) {
                (Some(x), Some(t)) => Some((&mut **x, t.layout())),
                _ => None,
            },
            scalars: w.k,
        })
        .collect();
    Ok(multi_tensor::adam_step(op, &mut list, hyper)?)
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
        let mut work = Vec::with_capacity(items.len());
        for StepItem {
            param,
            grad: g,
            state: s,
            ..
        } in items
        {
            if o.amsgrad && s.max_exp_avg_sq.is_none() {
                let _state = crate::optimizer::optimizer_state();
                s.max_exp_avg_sq = Some(param.zeros_like()?);
            }
            s.step += 1;
            let t = s.step as f64;
            let bc1 = 1.0 - o.betas.0.powf(t);
            let bc2 = 1.0 - o.betas.1.powf(t);
            let s: &AdamState = s;
            work.push((
                param.device(),
                Work {
                    p: param.tensor(),
                    g,
                    m: &s.exp_avg,
                    v: &s.exp_avg_sq,
                    vmax: s.max_exp_avg_sq.as_ref().filter(|_| o.amsgrad),
                    k: AdamStepScalars {
                        step_size: o.lr / bc1,
                        bias_correction2_sqrt: bc2.sqrt(),
                    },
                },
            ));
        }
        let hyper = AdamHyper {
            lr: o.lr,
            beta1: o.betas.0,
            beta2: o.betas.1,
            eps: o.eps,
            weight_decay: o.weight_decay,
            decoupled: self.decoupled,
            maximize: o.maximize,
            grad_scale: scale,
        };
        for list in by_device(work) {
            adam_pass(self.name(), &hyper, &list)?;
        }
        Ok(())
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
            r.buffers.get(k).ok_or_else(|| {
                crate::Error::StateDict(format!(
                    "parameter state lacks `{k}`; load a state dict saved by Adam/AdamW"
                ))
            })
        };
        Ok(AdamState {
            step: r.step,
            exp_avg: get("exp_avg")?.to_tensor_like(p, "exp_avg")?,
            exp_avg_sq: get("exp_avg_sq")?.to_nonnegative_tensor_like(p, "exp_avg_sq")?,
            max_exp_avg_sq: r
                .buffers
                .get("max_exp_avg_sq")
                .map(|b| b.to_nonnegative_tensor_like(p, "max_exp_avg_sq"))
                .transpose()?,
        })
    }
}
