//! The multiplicative-decay schedulers: StepLR, MultiStepLR, ExponentialLR, ConstantLR,
//! LinearLR, PolynomialLR.
//!
//! Each `get_lr` is PyTorch's recursive form (new lr = current group lr times a factor, or the
//! group lr unchanged), evaluated in PyTorch's operation order; each `closed_form_lr` is
//! PyTorch's `_get_closed_form_lr`, used only when SequentialLR jumps a scheduler to epoch 0.
//! Python's `float ** int` is C `pow` on doubles, so powers use `powf`, never `powi`.

use serde::{Deserialize, Serialize};

use crate::error::{invalid, Result};
use crate::param_group::ParamGroupLr;
use crate::scheduler::{
    core_accessors, group_lrs, impl_lr_scheduler, Chainable, Core, LrScheduler,
};
use crate::state_check::whole_struct_state;
use crate::state_check::{epochs, Check, ValidState};

pub(crate) fn check_gamma(scheduler: &'static str, gamma: f64) -> Result<()> {
    if gamma > 0.0 && gamma.is_finite() {
        Ok(())
    } else {
        Err(invalid(
            scheduler,
            "gamma",
            gamma,
            "the multiplicative decay factor must be finite and > 0 (e.g. 0.1 to divide the lr by 10)",
        ))
    }
}

fn check_total_iters(scheduler: &'static str, total_iters: usize) -> Result<()> {
    if total_iters == 0 {
        Err(invalid(
            scheduler,
            "total_iters",
            0,
            "use at least 1 (the number of steps the schedule spans)",
        ))
    } else {
        Ok(())
    }
}

/// Multiply every group's lr by `gamma` every `step_size` epochs (PyTorch `StepLR`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepLR {
    core: Core,
    step_size: i64,
    gamma: f64,
}

impl StepLR {
    /// Attach to `opt` and take the construction-time step. Errors when `step_size` is 0 or
    /// `gamma` is not a finite positive number.
    pub fn new(opt: &mut dyn ParamGroupLr, step_size: usize, gamma: f64) -> Result<Self> {
        if step_size == 0 {
            return Err(invalid(
                Self::NAME,
                "step_size",
                0,
                "use a period of at least 1 epoch",
            ));
        }
        check_gamma(Self::NAME, gamma)?;
        let mut s = Self {
            step_size: epochs(Self::NAME, "step_size", step_size)?,
            core: Core::attach(Self::NAME, opt)?,
            gamma,
        };
        s.initial_step(opt)?;
        Ok(s)
    }
}

impl Chainable for StepLR {
    const NAME: &'static str = "StepLR";
    core_accessors!();
    fn get_lr(&mut self, opt: &mut dyn ParamGroupLr) -> Result<Vec<f64>> {
        let e = self.core.last_epoch;
        if e == 0 || e.rem_euclid(self.step_size) != 0 {
            return Ok(group_lrs(opt));
        }
        Ok(group_lrs(opt)
            .into_iter()
            .map(|lr| lr * self.gamma)
            .collect())
    }
    fn closed_form_lr(&self) -> Option<Vec<f64>> {
        let k = self.core.last_epoch.div_euclid(self.step_size) as f64;
        Some(
            self.core
                .base_lrs
                .iter()
                .map(|b| b * self.gamma.powf(k))
                .collect(),
        )
    }
    whole_struct_state!();
}
impl_lr_scheduler!(StepLR);

impl ValidState for StepLR {
    fn validate(&self, live: &Self) -> Result<()> {
        let c = Check(Self::NAME);
        c.core(&self.core, &live.core)?;
        c.count("step_size", self.step_size, 1)?;
        c.positive("gamma", self.gamma)
    }
}

/// Multiply every group's lr by `gamma` at each milestone epoch (PyTorch `MultiStepLR`).
/// A milestone listed twice multiplies by `gamma` twice, as PyTorch's `Counter` does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MultiStepLR {
    core: Core,
    milestones: Vec<i64>,
    gamma: f64,
}

impl MultiStepLR {
    /// Attach to `opt`. Errors when `milestones` is not sorted ascending or `gamma` is not a
    /// finite positive number.
    pub fn new(opt: &mut dyn ParamGroupLr, milestones: &[usize], gamma: f64) -> Result<Self> {
        if milestones.windows(2).any(|w| w[0] > w[1]) {
            return Err(invalid(
                Self::NAME,
                "milestones",
                format!("{milestones:?}"),
                "list the epochs in ascending order, e.g. [30, 80]",
            ));
        }
        check_gamma(Self::NAME, gamma)?;
        let mut s = Self {
            milestones: milestones
                .iter()
                .map(|&m| epochs(Self::NAME, "milestones", m))
                .collect::<Result<_>>()?,
            core: Core::attach(Self::NAME, opt)?,
            gamma,
        };
        s.initial_step(opt)?;
        Ok(s)
    }
}

impl Chainable for MultiStepLR {
    const NAME: &'static str = "MultiStepLR";
    core_accessors!();
    fn get_lr(&mut self, opt: &mut dyn ParamGroupLr) -> Result<Vec<f64>> {
        let e = self.core.last_epoch;
        let count = self.milestones.iter().filter(|&&m| m == e).count();
        if count == 0 {
            return Ok(group_lrs(opt));
        }
        let factor = self.gamma.powf(count as f64);
        Ok(group_lrs(opt).into_iter().map(|lr| lr * factor).collect())
    }
    fn closed_form_lr(&self) -> Option<Vec<f64>> {
        let passed = self
            .milestones
            .partition_point(|&m| m <= self.core.last_epoch) as f64;
        Some(
            self.core
                .base_lrs
                .iter()
                .map(|b| b * self.gamma.powf(passed))
                .collect(),
        )
    }
    whole_struct_state!();
}
impl_lr_scheduler!(MultiStepLR);

impl ValidState for MultiStepLR {
    fn validate(&self, live: &Self) -> Result<()> {
        let c = Check(Self::NAME);
        c.core(&self.core, &live.core)?;
        for (i, &m) in self.milestones.iter().enumerate() {
            c.count(&format!("milestones[{i}]"), m, 0)?;
        }
        c.that(
            self.milestones.windows(2).all(|w| w[0] <= w[1]),
            "milestones",
            format!("{:?}", self.milestones),
            "must be in ascending order",
        )?;
        c.positive("gamma", self.gamma)
    }
}

/// Multiply every group's lr by `gamma` every epoch (PyTorch `ExponentialLR`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExponentialLR {
    core: Core,
    gamma: f64,
}

impl ExponentialLR {
    /// Attach to `opt`. Errors when `gamma` is not a finite positive number.
    pub fn new(opt: &mut dyn ParamGroupLr, gamma: f64) -> Result<Self> {
        check_gamma(Self::NAME, gamma)?;
        let mut s = Self {
            core: Core::attach(Self::NAME, opt)?,
            gamma,
        };
        s.initial_step(opt)?;
        Ok(s)
    }
}

impl Chainable for ExponentialLR {
    const NAME: &'static str = "ExponentialLR";
    core_accessors!();
    fn get_lr(&mut self, opt: &mut dyn ParamGroupLr) -> Result<Vec<f64>> {
        if self.core.initial {
            return Ok(group_lrs(opt));
        }
        Ok(group_lrs(opt)
            .into_iter()
            .map(|lr| lr * self.gamma)
            .collect())
    }
    fn closed_form_lr(&self) -> Option<Vec<f64>> {
        let e = self.core.last_epoch as f64;
        Some(
            self.core
                .base_lrs
                .iter()
                .map(|b| b * self.gamma.powf(e))
                .collect(),
        )
    }
    whole_struct_state!();
}
impl_lr_scheduler!(ExponentialLR);

impl ValidState for ExponentialLR {
    fn validate(&self, live: &Self) -> Result<()> {
        let c = Check(Self::NAME);
        c.core(&self.core, &live.core)?;
        c.positive("gamma", self.gamma)
    }
}

/// Scale every group's lr by `factor` for the first `total_iters` epochs, then restore it
/// (PyTorch `ConstantLR`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConstantLR {
    core: Core,
    factor: f64,
    total_iters: i64,
}

impl ConstantLR {
    /// Attach to `opt`. PyTorch's defaults are `factor = 1/3`, `total_iters = 5`. Errors when
    /// `factor` is outside (0, 1] or `total_iters` is 0.
    pub fn new(opt: &mut dyn ParamGroupLr, factor: f64, total_iters: usize) -> Result<Self> {
        if !(factor > 0.0 && factor <= 1.0) {
            return Err(invalid(
                Self::NAME,
                "factor",
                factor,
                "use a multiplicative factor in (0, 1] (0 would divide by zero when restoring)",
            ));
        }
        check_total_iters(Self::NAME, total_iters)?;
        let mut s = Self {
            core: Core::attach(Self::NAME, opt)?,
            factor,
            total_iters: epochs(Self::NAME, "total_iters", total_iters)?,
        };
        s.initial_step(opt)?;
        Ok(s)
    }
}

impl Chainable for ConstantLR {
    const NAME: &'static str = "ConstantLR";
    core_accessors!();
    fn get_lr(&mut self, opt: &mut dyn ParamGroupLr) -> Result<Vec<f64>> {
        let e = self.core.last_epoch;
        let lrs = group_lrs(opt);
        if e == 0 {
            return Ok(lrs.into_iter().map(|lr| lr * self.factor).collect());
        }
        if e != self.total_iters {
            return Ok(lrs);
        }
        Ok(lrs.into_iter().map(|lr| lr * (1.0 / self.factor)).collect())
    }
    fn closed_form_lr(&self) -> Option<Vec<f64>> {
        let done = if self.core.last_epoch >= self.total_iters {
            1.0
        } else {
            0.0
        };
        Some(
            self.core
                .base_lrs
                .iter()
                .map(|b| b * (self.factor + done * (1.0 - self.factor)))
                .collect(),
        )
    }
    whole_struct_state!();
}
impl_lr_scheduler!(ConstantLR);

impl ValidState for ConstantLR {
    fn validate(&self, live: &Self) -> Result<()> {
        let c = Check(Self::NAME);
        c.core(&self.core, &live.core)?;
        c.that(
            self.factor > 0.0 && self.factor <= 1.0,
            "factor",
            self.factor,
            "must be in (0, 1]",
        )?;
        c.count("total_iters", self.total_iters, 1)
    }
}

/// Move every group's lr linearly from `start_factor` to `end_factor` times its base lr over
/// `total_iters` epochs (PyTorch `LinearLR`; the usual warm-up).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinearLR {
    core: Core,
    start_factor: f64,
    end_factor: f64,
    total_iters: i64,
}

impl LinearLR {
    /// Attach to `opt`. PyTorch's defaults are `start_factor = 1/3`, `end_factor = 1.0`,
    /// `total_iters = 5`. Errors when `start_factor` is outside (0, 1], `end_factor` outside
    /// [0, 1] or `total_iters` is 0.
    pub fn new(
        opt: &mut dyn ParamGroupLr,
        start_factor: f64,
        end_factor: f64,
        total_iters: usize,
    ) -> Result<Self> {
        if !(start_factor > 0.0 && start_factor <= 1.0) {
            return Err(invalid(
                Self::NAME,
                "start_factor",
                start_factor,
                "use a starting factor in (0, 1]",
            ));
        }
        if !(0.0..=1.0).contains(&end_factor) {
            return Err(invalid(
                Self::NAME,
                "end_factor",
                end_factor,
                "use an ending factor in [0, 1]",
            ));
        }
        check_total_iters(Self::NAME, total_iters)?;
        let mut s = Self {
            core: Core::attach(Self::NAME, opt)?,
            start_factor,
            end_factor,
            total_iters: epochs(Self::NAME, "total_iters", total_iters)?,
        };
        s.initial_step(opt)?;
        Ok(s)
    }
}

impl Chainable for LinearLR {
    const NAME: &'static str = "LinearLR";
    core_accessors!();
    fn get_lr(&mut self, opt: &mut dyn ParamGroupLr) -> Result<Vec<f64>> {
        let e = self.core.last_epoch;
        let lrs = group_lrs(opt);
        if e == 0 {
            return Ok(lrs.into_iter().map(|lr| lr * self.start_factor).collect());
        }
        if self.core.initial || e > self.total_iters {
            return Ok(lrs);
        }
        let span = self.end_factor - self.start_factor;
        let denom = self.total_iters as f64 * self.start_factor + (e - 1) as f64 * span;
        let factor = 1.0 + span / denom;
        Ok(lrs.into_iter().map(|lr| lr * factor).collect())
    }
    fn closed_form_lr(&self) -> Option<Vec<f64>> {
        let t = self.core.last_epoch.min(self.total_iters) as f64;
        let span = self.end_factor - self.start_factor;
        Some(
            self.core
                .base_lrs
                .iter()
                .map(|b| b * (self.start_factor + span * t / self.total_iters as f64))
                .collect(),
        )
    }
    whole_struct_state!();
}
impl_lr_scheduler!(LinearLR);

impl ValidState for LinearLR {
    fn validate(&self, live: &Self) -> Result<()> {
        let c = Check(Self::NAME);
        c.core(&self.core, &live.core)?;
        c.that(
            self.start_factor > 0.0 && self.start_factor <= 1.0,
            "start_factor",
            self.start_factor,
            "must be in (0, 1]",
        )?;
        c.that(
            (0.0..=1.0).contains(&self.end_factor),
            "end_factor",
            self.end_factor,
            "must be in [0, 1]",
        )?;
        c.count("total_iters", self.total_iters, 1)
    }
}

/// Decay every group's lr polynomially to 0 over `total_iters` epochs (PyTorch
/// `PolynomialLR`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolynomialLR {
    core: Core,
    total_iters: i64,
    power: f64,
}

impl PolynomialLR {
    /// Attach to `opt`. PyTorch's defaults are `total_iters = 5`, `power = 1.0`. Errors when
    /// `total_iters` is 0 or `power` is negative or not finite.
    pub fn new(opt: &mut dyn ParamGroupLr, total_iters: usize, power: f64) -> Result<Self> {
        check_total_iters(Self::NAME, total_iters)?;
        if !(power >= 0.0 && power.is_finite()) {
            return Err(invalid(
                Self::NAME,
                "power",
                power,
                "use a finite power >= 0 (1.0 decays linearly)",
            ));
        }
        let mut s = Self {
            total_iters: epochs(Self::NAME, "total_iters", total_iters)?,
            core: Core::attach(Self::NAME, opt)?,
            power,
        };
        s.initial_step(opt)?;
        Ok(s)
    }
}

impl Chainable for PolynomialLR {
    const NAME: &'static str = "PolynomialLR";
    core_accessors!();
    fn get_lr(&mut self, opt: &mut dyn ParamGroupLr) -> Result<Vec<f64>> {
        let e = self.core.last_epoch;
        let lrs = group_lrs(opt);
        if self.core.initial || e > self.total_iters {
            return Ok(lrs);
        }
        let t = self.total_iters as f64;
        let decay = ((1.0 - e as f64 / t) / (1.0 - (e - 1) as f64 / t)).powf(self.power);
        Ok(lrs.into_iter().map(|lr| lr * decay).collect())
    }
    fn closed_form_lr(&self) -> Option<Vec<f64>> {
        let t = self.total_iters as f64;
        let e = self.core.last_epoch.min(self.total_iters) as f64;
        Some(
            self.core
                .base_lrs
                .iter()
                .map(|b| b * (1.0 - e / t).powf(self.power))
                .collect(),
        )
    }
    whole_struct_state!();
}
impl_lr_scheduler!(PolynomialLR);

impl ValidState for PolynomialLR {
    fn validate(&self, live: &Self) -> Result<()> {
        let c = Check(Self::NAME);
        c.core(&self.core, &live.core)?;
        c.count("total_iters", self.total_iters, 1)?;
        c.non_negative("power", self.power)
    }
}
