//! Per-batch cyclical schedules that also cycle momentum: CyclicLR and OneCycleLR.
//!
//! Both are closed form in the step number, and both may cycle the optimizer's momentum (or
//! Adam's beta1) inversely to the lr through [`ParamGroupLr::set_momentum`]; building one
//! with `cycle_momentum` on an optimizer without momentum is an error, as in PyTorch.
//! OneCycleLR's phases are PyTorch's: (warm-up to `max_lr`, anneal to `min_lr`), or with
//! `three_phase` (warm-up, symmetric cool-down to the initial lr, anneal to `min_lr`).

use serde::{Deserialize, Serialize};

use crate::error::{invalid, Result, SchedError};
use crate::param_group::{ParamGroupLr, PerGroup};
use crate::scheduler::{core_accessors, impl_lr_scheduler, Chainable, Core, LrScheduler};
use crate::state_check::whole_struct_state;
use crate::state_check::{Check, ValidState};

use std::f64::consts::PI;

/// CyclicLR's amplitude policy (PyTorch `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CyclicMode {
    /// Constant amplitude.
    Triangular,
    /// Amplitude halves every cycle.
    Triangular2,
    /// Amplitude scales by `gamma ** iteration`.
    ExpRange,
}

/// Options of [`CyclicLR`] (PyTorch keyword arguments and defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CyclicOptions {
    /// Steps in the increasing half of a cycle (default 2000).
    pub step_size_up: usize,
    /// Steps in the decreasing half; `None` means equal to `step_size_up`.
    pub step_size_down: Option<usize>,
    /// Amplitude policy (default triangular).
    pub mode: CyclicMode,
    /// Base of `ExpRange` scaling (default 1.0).
    pub gamma: f64,
    /// Cycle momentum inversely to the lr (default true).
    pub cycle_momentum: bool,
    /// Momentum at the lr peak (default 0.8).
    pub base_momentum: PerGroup,
    /// Momentum at the lr trough (default 0.9).
    pub max_momentum: PerGroup,
}

impl Default for CyclicOptions {
    fn default() -> Self {
        Self {
            step_size_up: 2000,
            step_size_down: None,
            mode: CyclicMode::Triangular,
            gamma: 1.0,
            cycle_momentum: true,
            base_momentum: PerGroup::All(0.8),
            max_momentum: PerGroup::All(0.9),
        }
    }
}

/// Errors unless every lr of `parameter` is >= 0 (a negative lr climbs the loss; kiln's
/// optimizers refuse it).
fn check_lrs(scheduler: &'static str, parameter: &'static str, lrs: &[f64]) -> Result<()> {
    match lrs.iter().find(|&&lr| lr < 0.0) {
        Some(lr) => Err(invalid(
            scheduler,
            parameter,
            lr,
            "use a learning rate >= 0",
        )),
        None => Ok(()),
    }
}

/// Cycle every group's lr between `base_lr` and `max_lr` (PyTorch `CyclicLR`); step it after
/// every batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CyclicLR {
    core: Core,
    max_lrs: Vec<f64>,
    total_size: f64,
    step_ratio: f64,
    mode: CyclicMode,
    gamma: f64,
    cycle_momentum: bool,
    base_momentums: Vec<f64>,
    max_momentums: Vec<f64>,
}

impl CyclicLR {
    /// Attach to `opt`, setting each group's lr to its `base_lr` (and momentum to
    /// `max_momentum` when cycling). Errors when `step_size_up` is 0, `gamma` is not positive,
    /// a per-group list has the wrong length, or `cycle_momentum` is on and `opt` has no
    /// momentum.
    pub fn new(
        opt: &mut dyn ParamGroupLr,
        base_lr: impl Into<PerGroup>,
        max_lr: impl Into<PerGroup>,
        options: CyclicOptions,
    ) -> Result<Self> {
        let n = opt.num_lr_groups();
        if n == 0 {
            return Err(SchedError::NoGroups {
                scheduler: Self::NAME,
            });
        }
        let base_lrs = base_lr.into().resolve(Self::NAME, "base_lr", n)?;
        let max_lrs = max_lr.into().resolve(Self::NAME, "max_lr", n)?;
        check_lrs(Self::NAME, "base_lr", &base_lrs)?;
        check_lrs(Self::NAME, "max_lr", &max_lrs)?;
        if options.step_size_up == 0 {
            return Err(invalid(
                Self::NAME,
                "step_size_up",
                0,
                "use at least 1 step for the rising half of the cycle",
            ));
        }
        crate::schedulers::basic::check_gamma(Self::NAME, options.gamma)?;
        let up = options.step_size_up as f64;
        let down = options.step_size_down.map_or(up, |d| d as f64);
        let total_size = up + down;
        let (base_momentums, max_momentums) = if options.cycle_momentum {
            if (0..n).any(|g| opt.group_momentum(g).is_none()) {
                return Err(SchedError::NoMomentum {
                    scheduler: Self::NAME,
                });
            }
            (
                options
                    .base_momentum
                    .resolve(Self::NAME, "base_momentum", n)?,
                options
                    .max_momentum
                    .resolve(Self::NAME, "max_momentum", n)?,
            )
        } else {
            (Vec::new(), Vec::new())
        };
        for (g, &lr) in base_lrs.iter().enumerate() {
            opt.set_group_lr(g, lr)?;
        }
        for (g, &m) in max_momentums.iter().enumerate() {
            opt.set_group_momentum(g, m)?;
        }
        let mut core = Core::attach(Self::NAME, opt)?;
        core.base_lrs = base_lrs;
        let mut s = Self {
            core,
            max_lrs,
            total_size,
            step_ratio: up / total_size,
            mode: options.mode,
            gamma: options.gamma,
            cycle_momentum: options.cycle_momentum,
            base_momentums,
            max_momentums,
        };
        s.initial_step(opt)?;
        Ok(s)
    }

    fn scale(&self, cycle: f64) -> f64 {
        match self.mode {
            CyclicMode::Triangular => 1.0,
            CyclicMode::Triangular2 => 1.0 / 2.0f64.powf(cycle - 1.0),
            CyclicMode::ExpRange => self.gamma.powf(self.core.last_epoch as f64),
        }
    }
}

impl Chainable for CyclicLR {
    const NAME: &'static str = "CyclicLR";
    core_accessors!();
    fn get_lr(&mut self, opt: &mut dyn ParamGroupLr) -> Result<Vec<f64>> {
        let e = self.core.last_epoch as f64;
        let cycle = (1.0 + e / self.total_size).floor();
        let x = 1.0 + e / self.total_size - cycle;
        let scale_factor = if x <= self.step_ratio {
            x / self.step_ratio
        } else {
            (x - 1.0) / (self.step_ratio - 1.0)
        };
        let scale = self.scale(cycle);
        let lrs = self
            .core
            .base_lrs
            .iter()
            .zip(&self.max_lrs)
            .map(|(b, m)| b + (m - b) * scale_factor * scale)
            .collect();
        if self.cycle_momentum {
            for (g, (b, m)) in self
                .base_momentums
                .iter()
                .zip(&self.max_momentums)
                .enumerate()
            {
                opt.set_group_momentum(g, m - (m - b) * scale_factor * scale)?;
            }
        }
        Ok(lrs)
    }
    whole_struct_state!();
}
impl_lr_scheduler!(CyclicLR);

/// The momentum lists of a cycling scheduler: one finite value per group when cycling, none
/// otherwise.
fn check_momenta(c: Check, cycle: bool, base: &[f64], max: &[f64], groups: usize) -> Result<()> {
    let groups = if cycle { groups } else { 0 };
    c.per_group("base_momentums", base, groups, Check::finite)?;
    c.per_group("max_momentums", max, groups, Check::finite)
}

impl ValidState for CyclicLR {
    fn validate(&self, live: &Self) -> Result<()> {
        let c = Check(Self::NAME);
        c.core(&self.core, &live.core)?;
        let groups = live.core.base_lrs.len();
        c.per_group("max_lrs", &self.max_lrs, groups, Check::non_negative)?;
        c.that(
            self.total_size.is_finite() && self.total_size >= 1.0,
            "total_size",
            self.total_size,
            "must be a finite cycle length >= 1 step",
        )?;
        c.that(
            self.step_ratio > 0.0 && self.step_ratio <= 1.0,
            "step_ratio",
            self.step_ratio,
            "must be in (0, 1]",
        )?;
        c.positive("gamma", self.gamma)?;
        check_momenta(
            c,
            self.cycle_momentum,
            &self.base_momentums,
            &self.max_momentums,
            groups,
        )
    }
}

/// OneCycleLR's annealing curve between phase endpoints (PyTorch `anneal_strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Anneal {
    /// Half cosine (default).
    Cos,
    /// Straight line.
    Linear,
}

impl Anneal {
    fn apply(self, start: f64, end: f64, pct: f64) -> f64 {
        match self {
            Anneal::Cos => end + (start - end) / 2.0 * ((PI * pct).cos() + 1.0),
            Anneal::Linear => (end - start) * pct + start,
        }
    }
}

/// Options of [`OneCycleLR`] (PyTorch keyword arguments and defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OneCycleOptions {
    /// Fraction of the steps spent increasing the lr (default 0.3).
    pub pct_start: f64,
    /// Annealing curve (default cos).
    pub anneal_strategy: Anneal,
    /// Cycle momentum (or beta1) inversely to the lr (default true).
    pub cycle_momentum: bool,
    /// Momentum at the lr peak (default 0.85).
    pub base_momentum: PerGroup,
    /// Momentum at the start and end (default 0.95).
    pub max_momentum: PerGroup,
    /// initial lr = max_lr / div_factor (default 25).
    pub div_factor: f64,
    /// min lr = initial lr / final_div_factor (default 1e4).
    pub final_div_factor: f64,
    /// Use PyTorch's three-phase schedule (default false).
    pub three_phase: bool,
}

impl Default for OneCycleOptions {
    fn default() -> Self {
        Self {
            pct_start: 0.3,
            anneal_strategy: Anneal::Cos,
            cycle_momentum: true,
            base_momentum: PerGroup::All(0.85),
            max_momentum: PerGroup::All(0.95),
            div_factor: 25.0,
            final_div_factor: 1e4,
            three_phase: false,
        }
    }
}

/// Which per-group value a phase starts or ends at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum LrPoint {
    Initial,
    Max,
    Min,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum MomentumPoint {
    Max,
    Base,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct Phase {
    end_step: f64,
    start_lr: LrPoint,
    end_lr: LrPoint,
    start_momentum: MomentumPoint,
    end_momentum: MomentumPoint,
}

/// The 1cycle policy (PyTorch `OneCycleLR`): step it after every batch, `total_steps` times.
///
/// As in PyTorch the `total_steps`-th step extrapolates the last phase one step past its end
/// (slightly below `min_lr`; with linear annealing a tiny negative lr, e.g. -9.7e-5 for
/// `max_lr` 0.1 over 100 three-phase steps). kiln matches PyTorch's values exactly, that one
/// included: `get_last_lr` reports it and the optimizer holds it (kiln's optimizers take any
/// finite lr from a schedule, as PyTorch's param groups do), so a loop that steps once per
/// batch for `total_steps` batches ends without an error and never trains with it. Stepping
/// further is an error (`StepsExhausted`), as in PyTorch. Tested against PyTorch's sequence
/// (`tests/fixtures/onecycle_end.json`, from `gen_onecycle_end.py`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OneCycleLR {
    core: Core,
    total_steps: i64,
    phases: Vec<Phase>,
    anneal: Anneal,
    max_lrs: Vec<f64>,
    min_lrs: Vec<f64>,
    cycle_momentum: bool,
    base_momentums: Vec<f64>,
    max_momentums: Vec<f64>,
}

impl OneCycleLR {
    /// Attach to `opt` for `total_steps` steps (PyTorch's `epochs * steps_per_epoch`), setting
    /// each group's `initial_lr` to `max_lr / div_factor`. Errors name the bad parameter:
    /// `total_steps` 0, `pct_start` outside [0, 1] or leaving a phase zero steps long,
    /// non-positive `div_factor` / `final_div_factor`, wrong per-group list lengths,
    /// `cycle_momentum` on an optimizer without momentum.
    pub fn new(
        opt: &mut dyn ParamGroupLr,
        max_lr: impl Into<PerGroup>,
        total_steps: usize,
        options: OneCycleOptions,
    ) -> Result<Self> {
        let n = opt.num_lr_groups();
        if n == 0 {
            return Err(SchedError::NoGroups {
                scheduler: Self::NAME,
            });
        }
        if total_steps == 0 {
            return Err(invalid(
                Self::NAME,
                "total_steps",
                0,
                "use the number of optimizer steps in the run (epochs * steps_per_epoch), >= 1",
            ));
        }
        let checked_total_steps =
            crate::state_check::epochs(Self::NAME, "total_steps", total_steps)?;
        let p = options.pct_start;
        if !(0.0..=1.0).contains(&p) {
            return Err(invalid(
                Self::NAME,
                "pct_start",
                p,
                "use a fraction in [0, 1], e.g. 0.3",
            ));
        }
        for (name, v) in [
            ("div_factor", options.div_factor),
            ("final_div_factor", options.final_div_factor),
        ] {
            if !(v > 0.0 && v.is_finite()) {
                return Err(invalid(Self::NAME, name, v, "use a finite divisor > 0"));
            }
        }
        let total = total_steps as f64;
        let last = total - 1.0;
        use LrPoint as L;
        use MomentumPoint as M;
        let phase = |end_step, start_lr, end_lr, start_momentum, end_momentum| Phase {
            end_step,
            start_lr,
            end_lr,
            start_momentum,
            end_momentum,
        };
        let phases = if options.three_phase {
            vec![
                phase(p * total - 1.0, L::Initial, L::Max, M::Max, M::Base),
                phase(2.0 * p * total - 2.0, L::Max, L::Initial, M::Base, M::Max),
                phase(last, L::Initial, L::Min, M::Max, M::Max),
            ]
        } else {
            vec![
                phase(p * total - 1.0, L::Initial, L::Max, M::Max, M::Base),
                phase(last, L::Max, L::Min, M::Base, M::Max),
            ]
        };
        let mut start = 0.0;
        for ph in &phases {
            if ph.end_step == start {
                return Err(invalid(
                    Self::NAME,
                    "pct_start",
                    p,
                    format!(
                        "with total_steps = {total_steps} it leaves a phase zero steps long \
                         (0/0 in PyTorch): change pct_start or use more total_steps"
                    ),
                ));
            }
            start = ph.end_step;
        }
        let max_lrs = max_lr.into().resolve(Self::NAME, "max_lr", n)?;
        check_lrs(Self::NAME, "max_lr", &max_lrs)?;
        let (base_momentums, max_momentums) = if options.cycle_momentum {
            if (0..n).any(|g| opt.group_momentum(g).is_none()) {
                return Err(SchedError::NoMomentum {
                    scheduler: Self::NAME,
                });
            }
            (
                options
                    .base_momentum
                    .resolve(Self::NAME, "base_momentum", n)?,
                options
                    .max_momentum
                    .resolve(Self::NAME, "max_momentum", n)?,
            )
        } else {
            (Vec::new(), Vec::new())
        };
        let mut min_lrs = Vec::with_capacity(n);
        for (g, &m) in max_lrs.iter().enumerate() {
            let initial = m / options.div_factor;
            opt.set_group_initial_lr(g, initial)?;
            min_lrs.push(initial / options.final_div_factor);
        }
        for (g, &m) in max_momentums.iter().enumerate() {
            opt.set_group_momentum(g, m)?;
        }
        let mut s = Self {
            core: Core::attach(Self::NAME, opt)?,
            total_steps: checked_total_steps,
            phases,
            anneal: options.anneal_strategy,
            max_lrs,
            min_lrs,
            cycle_momentum: options.cycle_momentum,
            base_momentums,
            max_momentums,
        };
        s.initial_step(opt)?;
        Ok(s)
    }

    /// PyTorch's other form: `total_steps = epochs * steps_per_epoch`. Errors name whichever
    /// of the two is 0.
    pub fn with_epochs(
        opt: &mut dyn ParamGroupLr,
        max_lr: impl Into<PerGroup>,
        epochs: usize,
        steps_per_epoch: usize,
        options: OneCycleOptions,
    ) -> Result<Self> {
        for (name, v) in [("epochs", epochs), ("steps_per_epoch", steps_per_epoch)] {
            if v == 0 {
                return Err(invalid(Self::NAME, name, 0, "use a positive integer"));
            }
        }
        let total = epochs.checked_mul(steps_per_epoch).ok_or_else(|| {
            invalid(
                Self::NAME,
                "steps_per_epoch",
                steps_per_epoch,
                "epochs * steps_per_epoch overflows usize",
            )
        })?;
        Self::new(opt, max_lr, total, options)
    }

    /// The configured number of steps.
    pub fn total_steps(&self) -> usize {
        self.total_steps as usize
    }
}

impl Chainable for OneCycleLR {
    const NAME: &'static str = "OneCycleLR";
    core_accessors!();
    fn get_lr(&mut self, opt: &mut dyn ParamGroupLr) -> Result<Vec<f64>> {
        let step = self.core.last_epoch;
        if step > self.total_steps {
            return Err(SchedError::StepsExhausted {
                step,
                total_steps: self.total_steps,
            });
        }
        let step = step as f64;
        let mut lrs = Vec::with_capacity(self.max_lrs.len());
        let mut momentums = Vec::with_capacity(self.max_lrs.len());
        for g in 0..self.max_lrs.len() {
            let lr_at = |p: LrPoint| match p {
                LrPoint::Initial => self.core.base_lrs[g],
                LrPoint::Max => self.max_lrs[g],
                LrPoint::Min => self.min_lrs[g],
            };
            let mut start_step = 0.0;
            let last = self.phases.len() - 1;
            for (i, ph) in self.phases.iter().enumerate() {
                if step <= ph.end_step || i == last {
                    let pct = (step - start_step) / (ph.end_step - start_step);
                    lrs.push(self.anneal.apply(lr_at(ph.start_lr), lr_at(ph.end_lr), pct));
                    if self.cycle_momentum {
                        let m_at = |p: MomentumPoint| match p {
                            MomentumPoint::Max => self.max_momentums[g],
                            MomentumPoint::Base => self.base_momentums[g],
                        };
                        momentums.push(self.anneal.apply(
                            m_at(ph.start_momentum),
                            m_at(ph.end_momentum),
                            pct,
                        ));
                    }
                    break;
                }
                start_step = ph.end_step;
            }
        }
        for (g, m) in momentums.into_iter().enumerate() {
            opt.set_group_momentum(g, m)?;
        }
        Ok(lrs)
    }
    whole_struct_state!();
}
impl_lr_scheduler!(OneCycleLR);

impl ValidState for OneCycleLR {
    fn validate(&self, live: &Self) -> Result<()> {
        let c = Check(Self::NAME);
        c.core(&self.core, &live.core)?;
        let groups = live.core.base_lrs.len();
        c.count("total_steps", self.total_steps, 1)?;
        c.per_group("max_lrs", &self.max_lrs, groups, Check::non_negative)?;
        c.per_group("min_lrs", &self.min_lrs, groups, Check::non_negative)?;
        c.that(
            matches!(self.phases.len(), 2 | 3),
            "phases.len()",
            self.phases.len(),
            "must be 2 (or 3 with three_phase)",
        )?;
        let mut start = 0.0;
        for (i, ph) in self.phases.iter().enumerate() {
            c.that(
                ph.end_step.is_finite() && ph.end_step != start,
                &format!("phases[{i}].end_step"),
                ph.end_step,
                "must be finite and leave the phase at least one step long",
            )?;
            start = ph.end_step;
        }
        check_momenta(
            c,
            self.cycle_momentum,
            &self.base_momentums,
            &self.max_momentums,
            groups,
        )
    }
}
