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
//! `ParamGroupLr`'s methods are infallible while `Optimizer`'s return `Result`, because the
//! optimizer's accessors also serve users, who may pass any index. Schedulers only pass group
//! indices in `0..num_groups()` (each step first checks the optimizer still has as many groups
//! as when the scheduler was built) and only write finite, non-negative learning rates computed
//! from the groups' own, so the `Result`s here are always `Ok`; an `Err` would be a bug in a
//! scheduler and panics with the optimizer's message rather than being dropped.

use kiln_optim::{Algorithm, Optim, Optimizer};

use crate::param_group::ParamGroupLr;

/// Unwraps an optimizer accessor's result, which is `Ok` for every call a scheduler makes (see
/// the module docs).
fn in_range<T>(r: kiln_optim::Result<T>, what: &str, group: usize) -> T {
    r.unwrap_or_else(|e| panic!("scheduler {what} on parameter group {group}: {e}"))
}

impl<A: Algorithm> ParamGroupLr for Optim<A> {
    fn num_lr_groups(&self) -> usize {
        Optimizer::num_groups(self)
    }

    fn group_lr(&self, group: usize) -> f64 {
        in_range(Optimizer::lr(self, group), "read lr", group)
    }

    fn set_group_lr(&mut self, group: usize, lr: f64) {
        in_range(Optimizer::set_lr(self, group, lr), "set lr", group)
    }

    fn group_initial_lr(&self, group: usize) -> Option<f64> {
        in_range(Optimizer::initial_lr(self, group), "read initial_lr", group)
    }

    fn set_group_initial_lr(&mut self, group: usize, lr: f64) {
        in_range(
            Optimizer::set_initial_lr(self, group, lr),
            "set initial_lr",
            group,
        )
    }

    fn group_momentum(&self, group: usize) -> Option<f64> {
        in_range(Optimizer::momentum(self, group), "read momentum", group)
    }

    fn set_group_momentum(&mut self, group: usize, momentum: f64) {
        // Ignored when the optimizer has neither momentum nor betas (the trait's contract).
        if ParamGroupLr::group_momentum(self, group).is_some() {
            in_range(
                Optimizer::set_momentum(self, group, momentum),
                "set momentum",
                group,
            )
        }
    }
}
