//! SGD with momentum, dampening, Nesterov momentum, weight decay and maximize, following
//! PyTorch's `torch.optim.SGD` update step for step:
//!
//! ```text
//! g = grad (negated when maximize); g += weight_decay * p
//! if momentum != 0:
//!     buf = g at the first step, else buf = momentum * buf + (1 - dampening) * g
//!     g = g + momentum * buf when nesterov, else buf
//! p -= lr * g
//! ```
//!
//! One fused pass per step and device: `kiln_device::ops::multi_tensor::sgd_step` over every
//! parameter of the group (fixed chunks zipped with gradient and momentum buffer, in parallel
//! on the CPU; one launch on CUDA).
//!
//! Invariants: options are validated when a group is built or changed; every gradient is
//! checked before any buffer is written; a momentum buffer is created at the first step with
//! nonzero momentum and takes the gradient as it is on that step.

use crate::group::{IntoParamGroups, ParamGroup};
use crate::operands::by_device;
use crate::optimizer::{Algorithm, GroupOptions, GroupedOptimizer, StepItem};
use crate::state_dict::{ParamStateRecord, TensorRecord};
use crate::{arg_err, Result};
use kiln_autograd::{Parameter, Tensor};
use kiln_device::ops::multi_tensor::{self, SgdHyper, SgdOperands};
use serde::{Deserialize, Serialize};

/// The options of an SGD group (PyTorch's names and defaults).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SgdOptions {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// Momentum factor (default 0).
    pub momentum: f64,
    /// Dampening for momentum (default 0).
    pub dampening: f64,
    /// L2 penalty added to the gradient (default 0).
    pub weight_decay: f64,
    /// Nesterov momentum (default false).
    pub nesterov: bool,
    /// Maximize the objective instead of minimising it (default false).
    pub maximize: bool,
}

impl Default for SgdOptions {
    fn default() -> Self {
        SgdOptions {
            lr: 1e-3,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            maximize: false,
        }
    }
}

impl SgdOptions {
    option_setter!(lr: f64, "Sets the learning rate.");
    option_setter!(momentum: f64, "Sets the momentum.");
    option_setter!(dampening: f64, "Sets the dampening.");
    option_setter!(weight_decay: f64, "Sets the weight decay.");
    option_setter!(nesterov: bool, "Sets Nesterov momentum.");
    option_setter!(maximize: bool, "Sets maximize.");
}

fn check_no(op: &'static str, name: &str, set: bool) -> Result<()> {
    if set {
        return Err(arg_err(
            op,
            format!("a parameter group sets `{name}`, which {op} has not got; remove it"),
        ));
    }
    Ok(())
}

impl GroupOptions for SgdOptions {
    fn resolve(&self, g: &ParamGroup) -> Result<Self> {
        check_no("SGD", "betas", g.betas.is_some())?;
        check_no("SGD", "eps", g.eps.is_some())?;
        check_no("SGD", "amsgrad", g.amsgrad.is_some())?;
        let o = SgdOptions {
            lr: g.lr.unwrap_or(self.lr),
            momentum: g.momentum.unwrap_or(self.momentum),
            dampening: g.dampening.unwrap_or(self.dampening),
            weight_decay: g.weight_decay.unwrap_or(self.weight_decay),
            nesterov: g.nesterov.unwrap_or(self.nesterov),
            maximize: g.maximize.unwrap_or(self.maximize),
        };
        o.validate()?;
        Ok(o)
    }
    fn validate(&self) -> Result<()> {
        let bad =
            |what: &str, v: f64| arg_err("SGD", format!("invalid {what} {v:?}; it must be >= 0"));
        if self.lr.is_nan() || self.lr < 0.0 {
            return Err(bad("learning rate", self.lr));
        }
        if self.momentum.is_nan() || self.momentum < 0.0 {
            return Err(bad("momentum", self.momentum));
        }
        if self.weight_decay.is_nan() || self.weight_decay < 0.0 {
            return Err(bad("weight_decay", self.weight_decay));
        }
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(arg_err(
                "SGD",
                "Nesterov momentum requires a momentum > 0 and zero dampening",
            ));
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
        Some(self.momentum)
    }
    fn set_momentum(&mut self, m: f64) -> bool {
        self.momentum = m;
        true
    }
    fn betas(&self) -> Option<(f64, f64)> {
        None
    }
    fn set_betas(&mut self, _: (f64, f64)) -> bool {
        false
    }
}

/// Per-parameter SGD state: the momentum buffer (absent until the first step with momentum).
#[derive(Debug)]
pub struct SgdState {
    /// Steps taken.
    pub step: u64,
    /// The momentum buffer.
    pub momentum_buffer: Option<Tensor>,
}

/// The SGD algorithm (use it through [`Sgd`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct SgdAlgorithm;

/// Stochastic gradient descent (PyTorch's `torch.optim.SGD`).
pub type Sgd = GroupedOptimizer<SgdAlgorithm>;

impl Sgd {
    /// SGD over `groups`; options a group leaves unset come from `defaults`.
    pub fn new(groups: impl IntoParamGroups, defaults: SgdOptions) -> Result<Self> {
        GroupedOptimizer::with_algorithm(SgdAlgorithm, groups.into_param_groups(), defaults)
    }
}

/// A parameter, its gradient, its momentum buffer, and whether this is the buffer's first step.
type SgdWork<'a> = (&'a Tensor, Tensor, Option<&'a Tensor>, bool);

/// One fused step over `work` (all on one device) through kiln-device's multi-tensor SGD.
fn sgd_pass(hyper: &SgdHyper, work: &[SgdWork<'_>]) -> Result<()> {
    let mut pw = work
        .iter()
        .map(|w| w.0.storage_write())
        .collect::<Result<Vec<_>, _>>()?;
    let gr: Vec<_> = work.iter().map(|w| w.1.storage_read()).collect();
    let mut bw = work
        .iter()
        .map(|w| w.2.as_ref().map(|b| b.storage_write()).transpose())
        .collect::<Result<Vec<_>, _>>()?;
    let guards = pw.iter_mut().zip(&gr).zip(bw.iter_mut());
    let mut list: Vec<SgdOperands<'_>> = work
        .iter()
        .zip(guards)
        .map(|((p, g, buf, first), ((pg, gg), bg))| SgdOperands {
            param: (&mut **pg, p.layout()),
            grad: (&**gg, g.layout()),
            momentum_buffer: match (bg.as_mut(), buf) {
                (Some(b), Some(t)) => Some((&mut **b, t.layout())),
                _ => None,
            },
            first_momentum_step: *first,
        })
        .collect();
    Ok(multi_tensor::sgd_step("SGD.step", &mut list, hyper)?)
}

impl Algorithm for SgdAlgorithm {
    type Options = SgdOptions;
    type State = SgdState;

    fn name(&self) -> &'static str {
        "SGD"
    }

    fn step_op(&self) -> &'static str {
        "SGD.step"
    }

    fn init_state(&self, _: &SgdOptions, _: &Parameter) -> Result<SgdState> {
        Ok(SgdState {
            step: 0,
            momentum_buffer: None,
        })
    }

    fn step_group(
        &self,
        o: &SgdOptions,
        items: Vec<StepItem<'_, SgdState>>,
        scale: f64,
    ) -> Result<()> {
        let mut work = Vec::with_capacity(items.len());
        for StepItem {
            param, grad, state, ..
        } in items
        {
            let mut first = false;
            if o.momentum != 0.0 && state.momentum_buffer.is_none() {
                let _state = crate::optimizer::optimizer_state();
                state.momentum_buffer = Some(param.zeros_like()?);
                first = true;
            }
            state.step += 1;
            let state: &SgdState = state;
            work.push((
                param.device(),
                (
                    param.tensor(),
                    grad,
                    state.momentum_buffer.as_ref().filter(|_| o.momentum != 0.0),
                    first,
                ),
            ));
        }
        let hyper = SgdHyper {
            lr: o.lr,
            momentum: o.momentum,
            dampening: o.dampening,
            weight_decay: o.weight_decay,
            nesterov: o.nesterov,
            maximize: o.maximize,
            grad_scale: scale,
        };
        for list in by_device(work) {
            sgd_pass(&hyper, &list)?;
        }
        Ok(())
    }

    fn save_state(&self, s: &SgdState) -> Result<ParamStateRecord> {
        let mut buffers = std::collections::BTreeMap::new();
        if let Some(b) = &s.momentum_buffer {
            buffers.insert("momentum_buffer".to_string(), TensorRecord::from_tensor(b)?);
        }
        Ok(ParamStateRecord {
            step: s.step,
            buffers,
        })
    }

    fn load_state(&self, r: &ParamStateRecord, p: &Parameter) -> Result<SgdState> {
        Ok(SgdState {
            step: r.step,
            momentum_buffer: r
                .buffers
                .get("momentum_buffer")
                .map(|b| b.to_tensor_like(p, "momentum_buffer"))
                .transpose()?,
        })
    }
}
