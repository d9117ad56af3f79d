//! [`ParamGroupLr`] for kiln-optim's optimizers (`Optim<A>`: SGD, Adam, AdamW), so every
//! scheduler here drives them directly:
//!
//! ```
//! use kiln_autograd::{DType, Device, Parameter, Tensor};
//! use kiln_optim::{AdamOptions, AdamW, Optimizer, ParamGroup};
//! use kiln_sched::{LrScheduler, StepLR};
//!
//! let p = Parameter::new(Tensor::zeros(&[4], DType::F32, Device::Cpu)?)?;
//! let mut opt = AdamW::new(
//!     vec![ParamGroup::new(vec![("w".into(), p)])],
//!     AdamOptions::adamw().lr(0.1),
//! )?;
//! let mut sched = StepLR::new(&mut opt, 1, 0.5)?;
//! sched.step(&mut opt)?;
//! assert_eq!(opt.lr(0)?, 0.05);
//! assert_eq!(opt.initial_lr(0)?, Some(0.1)); // kept in the optimizer's state dict
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The getters are infallible: schedulers pass only group indices in `0..num_groups()` (each
//! step first checks the optimizer still has as many groups as when the scheduler was built),
//! so an optimizer error there cannot happen; were it to, the getter reads NaN / `None`, which
//! the next write refuses, instead of panicking. The setters return the optimizer's refusal as
//! [`SchedError::Refused`](crate::SchedError::Refused). kiln's optimizers take any finite lr
//! from a schedule, as PyTorch's param groups do: OneCycleLR with linear annealing extrapolates
//! its `total_steps`-th lr slightly below 0 and the optimizer holds that value, exactly as
//! PyTorch's does (no step trains with it when the schedule steps once per batch).

use kiln_optim::{Algorithm, Optim, Optimizer};

use crate::error::{Result, SchedError};
use crate::param_group::ParamGroupLr;

/// The scheduler error for an optimizer's refusal of `value` for `what` in `group`.
fn refused(group: usize, what: &'static str, value: f64, e: kiln_optim::Error) -> SchedError {
    SchedError::Refused {
        group,
        what,
        value,
        reason: e.to_string(),
    }
}

impl<A: Algorithm> ParamGroupLr for Optim<A> {
    fn num_lr_groups(&self) -> usize {
        Optimizer::num_groups(self)
    }

    fn group_lr(&self, group: usize) -> f64 {
        Optimizer::lr(self, group).unwrap_or(f64::NAN)
    }

    fn set_group_lr(&mut self, group: usize, lr: f64) -> Result<()> {
        Optimizer::set_lr(self, group, lr).map_err(|e| refused(group, "lr", lr, e))
    }

    fn group_initial_lr(&self, group: usize) -> Option<f64> {
        Optimizer::initial_lr(self, group).ok().flatten()
    }

    fn set_group_initial_lr(&mut self, group: usize, lr: f64) -> Result<()> {
        Optimizer::set_initial_lr(self, group, lr).map_err(|e| refused(group, "initial_lr", lr, e))
    }

    fn group_momentum(&self, group: usize) -> Option<f64> {
        Optimizer::momentum(self, group).ok().flatten()
    }

    fn set_group_momentum(&mut self, group: usize, momentum: f64) -> Result<()> {
        // Ignored when the optimizer has neither momentum nor betas (the trait's contract).
        if ParamGroupLr::group_momentum(self, group).is_none() {
            return Ok(());
        }
        Optimizer::set_momentum(self, group, momentum)
            .map_err(|e| refused(group, "momentum", momentum, e))
    }
}
