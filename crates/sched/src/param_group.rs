//! What a scheduler needs from an optimizer: the [`ParamGroupLr`] trait.
//!
//! PyTorch schedulers reach into `optimizer.param_groups`, a list of dicts, and read or write
//! four keys: `lr`, `initial_lr` (the lr before any scheduler touched it, written once by the
//! first scheduler and shared by every later one, which is what makes `SequentialLR` and
//! `ChainedScheduler` compose), and `momentum` or `betas[0]` (cycled by `OneCycleLR` and
//! `CyclicLR`). kiln keeps that contract and nothing more: an optimizer implements
//! [`ParamGroupLr`] and every scheduler drives it through `&mut dyn ParamGroupLr` passed to
//! each call, so the scheduler never borrows the optimizer between steps.
//!
//! [`LrGroups`] is a plain implementation (lrs without parameters) for tests, plots, and
//! driving a schedule by hand.

use serde::{Deserialize, Serialize};

use crate::error::{Result, SchedError};

/// The learning-rate view of an optimizer's parameter groups that schedulers drive.
///
/// Group indices run from `0` to `num_lr_groups() - 1`; schedulers never pass anything else.
/// The method names differ from kiln-optim's `Optimizer` accessors (`lr`, `set_lr`,
/// `num_groups`, ...), so both traits can be in scope and `opt.lr(0)` still means one method.
/// An optimizer implements it over its own group storage; `initial_lr` needs one
/// `Option<f64>` per group:
///
/// ```
/// use kiln_sched::{LrScheduler, ParamGroupLr, Result, StepLR};
///
/// struct Group { lr: f64, initial_lr: Option<f64>, momentum: f64 }
/// struct Sgd { groups: Vec<Group> }
///
/// impl ParamGroupLr for Sgd {
///     fn num_lr_groups(&self) -> usize { self.groups.len() }
///     fn group_lr(&self, g: usize) -> f64 { self.groups[g].lr }
///     fn set_group_lr(&mut self, g: usize, lr: f64) -> Result<()> {
///         self.groups[g].lr = lr;
///         Ok(())
///     }
///     fn group_initial_lr(&self, g: usize) -> Option<f64> { self.groups[g].initial_lr }
///     fn set_group_initial_lr(&mut self, g: usize, lr: f64) -> Result<()> {
///         self.groups[g].initial_lr = Some(lr);
///         Ok(())
///     }
///     fn group_momentum(&self, g: usize) -> Option<f64> { Some(self.groups[g].momentum) }
///     fn set_group_momentum(&mut self, g: usize, m: f64) -> Result<()> {
///         self.groups[g].momentum = m;
///         Ok(())
///     }
/// }
///
/// let mut sgd = Sgd { groups: vec![Group { lr: 0.1, initial_lr: None, momentum: 0.9 }] };
/// let mut sched = StepLR::new(&mut sgd, 2, 0.5)?;
/// sched.step(&mut sgd)?;
/// sched.step(&mut sgd)?;
/// assert_eq!(sgd.groups[0].lr, 0.05);
/// # Ok::<(), kiln_sched::SchedError>(())
/// ```
pub trait ParamGroupLr {
    /// Number of parameter groups.
    fn num_lr_groups(&self) -> usize;
    /// Current learning rate of `group` (PyTorch `param_groups[group]["lr"]`).
    fn group_lr(&self, group: usize) -> f64;
    /// Set the learning rate of `group`; an optimizer that refuses the value (kiln's take only
    /// lr >= 0) returns [`SchedError::Refused`], and the scheduler undoes its step.
    fn set_group_lr(&mut self, group: usize, lr: f64) -> Result<()>;
    /// The lr recorded by the first scheduler attached to this optimizer (PyTorch
    /// `param_groups[group]["initial_lr"]`); `None` until a scheduler sets it.
    fn group_initial_lr(&self, group: usize) -> Option<f64>;
    /// Record `initial_lr` for `group`. Schedulers call this once when attached (and
    /// `OneCycleLR` overwrites it with `max_lr / div_factor`, as PyTorch does).
    /// Errors as [`set_group_lr`](Self::set_group_lr) does.
    fn set_group_initial_lr(&mut self, group: usize, lr: f64) -> Result<()>;
    /// The value momentum-cycling schedulers (`OneCycleLR`, `CyclicLR`) drive: `momentum` for
    /// SGD-like optimizers, `betas.0` (beta1) for Adam-like ones; `None` when the optimizer has
    /// neither (then `cycle_momentum` is an error). SGD returns `Some` even when momentum is 0,
    /// as PyTorch cycles it whenever the optimizer has the option.
    fn group_momentum(&self, group: usize) -> Option<f64> {
        let _ = group;
        None
    }
    /// Set the momentum (or beta1) of `group`; ignored when the optimizer has neither. Errors
    /// as [`set_group_lr`](Self::set_group_lr) does.
    fn set_group_momentum(&mut self, group: usize, momentum: f64) -> Result<()> {
        let _ = (group, momentum);
        Ok(())
    }
}

/// One parameter group of [`LrGroups`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LrGroup {
    /// Current learning rate.
    pub lr: f64,
    /// `initial_lr`, set by the first scheduler.
    pub initial_lr: Option<f64>,
    /// Momentum or beta1, when the simulated optimizer has one.
    pub momentum: Option<f64>,
}

/// Parameter-group learning rates without an optimizer: for tests, plotting a schedule, or
/// driving lrs by hand. Serializable, so it can be checkpointed beside a scheduler's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LrGroups {
    /// The groups.
    pub groups: Vec<LrGroup>,
}

impl LrGroups {
    /// Groups with these learning rates and no momentum.
    pub fn new(lrs: &[f64]) -> Self {
        Self {
            groups: lrs
                .iter()
                .map(|&lr| LrGroup {
                    lr,
                    initial_lr: None,
                    momentum: None,
                })
                .collect(),
        }
    }

    /// Groups with these learning rates, each with `momentum` (or beta1) set to `momentum`.
    pub fn with_momentum(lrs: &[f64], momentum: f64) -> Self {
        let mut groups = Self::new(lrs);
        for group in &mut groups.groups {
            group.momentum = Some(momentum);
        }
        groups
    }

    /// Current learning rates of all groups.
    pub fn lrs(&self) -> Vec<f64> {
        self.groups.iter().map(|g| g.lr).collect()
    }
}

impl ParamGroupLr for LrGroups {
    fn num_lr_groups(&self) -> usize {
        self.groups.len()
    }
    fn group_lr(&self, group: usize) -> f64 {
        self.groups[group].lr
    }
    fn set_group_lr(&mut self, group: usize, lr: f64) -> Result<()> {
        self.groups[group].lr = lr;
        Ok(())
    }
    fn group_initial_lr(&self, group: usize) -> Option<f64> {
        self.groups[group].initial_lr
    }
    fn set_group_initial_lr(&mut self, group: usize, lr: f64) -> Result<()> {
        self.groups[group].initial_lr = Some(lr);
        Ok(())
    }
    fn group_momentum(&self, group: usize) -> Option<f64> {
        self.groups[group].momentum
    }
    fn set_group_momentum(&mut self, group: usize, momentum: f64) -> Result<()> {
        if let Some(m) = &mut self.groups[group].momentum {
            *m = momentum;
        }
        Ok(())
    }
}

/// A hyper-parameter given once for all groups or once per group (PyTorch accepts a float or
/// a list for `max_lr`, `base_momentum`, `min_lr`, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PerGroup {
    /// The same value for every group.
    All(f64),
    /// One value per group, in group order.
    Each(Vec<f64>),
}

impl PerGroup {
    /// The value for each of `groups` groups, or an error naming `parameter` when a list has
    /// the wrong length or a value is NaN or infinite.
    pub fn resolve(
        &self,
        scheduler: &'static str,
        parameter: &'static str,
        groups: usize,
    ) -> Result<Vec<f64>> {
        let values = match self {
            PerGroup::All(v) => std::slice::from_ref(v),
            PerGroup::Each(values) => values.as_slice(),
        };
        if let Some(v) = values.iter().find(|v| !v.is_finite()) {
            return Err(crate::error::invalid(
                scheduler,
                parameter,
                v,
                "every value must be a finite number",
            ));
        }
        match self {
            PerGroup::All(v) => Ok(vec![*v; groups]),
            PerGroup::Each(values) if values.len() == groups => Ok(values.clone()),
            PerGroup::Each(values) => Err(SchedError::GroupCountMismatch {
                scheduler,
                parameter,
                expected: groups,
                got: values.len(),
            }),
        }
    }
}

impl From<f64> for PerGroup {
    fn from(v: f64) -> Self {
        PerGroup::All(v)
    }
}

impl From<Vec<f64>> for PerGroup {
    fn from(v: Vec<f64>) -> Self {
        PerGroup::Each(v)
    }
}

impl From<&[f64]> for PerGroup {
    fn from(v: &[f64]) -> Self {
        PerGroup::Each(v.to_vec())
    }
}

impl<const N: usize> From<[f64; N]> for PerGroup {
    fn from(v: [f64; N]) -> Self {
        PerGroup::Each(v.to_vec())
    }
}
