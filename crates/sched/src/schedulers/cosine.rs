//! Cosine schedules: CosineAnnealingLR and CosineAnnealingWarmRestarts (SGDR).
//!
//! CosineAnnealingLR is PyTorch's recursive form: between restarts each step multiplies the
//! distance to `eta_min` by a ratio of cosines; at `last_epoch = T_max + 1 (mod 2 T_max)`,
//! where that ratio would divide by zero, it adds the increment instead. Past `T_max` the lr
//! therefore climbs back up and oscillates with period `2 T_max`, exactly as in PyTorch.
//!
//! CosineAnnealingWarmRestarts is closed form in `T_cur / T_i` and keeps `T_cur` as f64,
//! because [`step_to`](CosineAnnealingWarmRestarts::step_to) accepts fractional epochs
//! (PyTorch `scheduler.step(epoch + i / iters)`).

use serde::{Deserialize, Serialize};

use crate::error::{invalid, Result};
use crate::param_group::ParamGroupLr;
use crate::scheduler::{
    core_accessors, from_state, group_lrs, impl_lr_scheduler, tagged, untag, write_lrs, Chainable,
    Core, GroupSnapshot, LrScheduler,
};
use crate::state_check::whole_struct_state;

use crate::state_check::{Check, ValidState, MAX_EPOCH};

use std::f64::consts::PI;

fn check_eta_min(scheduler: &'static str, eta_min: f64) -> Result<()> {
    if eta_min.is_finite() {
        Ok(())
    } else {
        Err(invalid(
            scheduler,
            "eta_min",
            eta_min,
            "use a finite minimum lr, e.g. 0.0",
        ))
    }
}

/// Anneal every group's lr from its base lr to `eta_min` along a half cosine over `T_max`
/// epochs (PyTorch `CosineAnnealingLR`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CosineAnnealingLR {
    core: Core,
    t_max: i64,
    eta_min: f64,
}

impl CosineAnnealingLR {
    /// Attach to `opt`. Errors when `t_max` is 0 or `eta_min` is not finite.
    pub fn new(opt: &mut dyn ParamGroupLr, t_max: usize, eta_min: f64) -> Result<Self> {
        if t_max == 0 {
            return Err(invalid(
                Self::NAME,
                "T_max",
                0,
                "use the number of epochs of the half cosine, at least 1",
            ));
        }
        check_eta_min(Self::NAME, eta_min)?;
        let mut s = Self {
            t_max: crate::state_check::epochs(Self::NAME, "T_max", t_max)?,
            core: Core::attach(Self::NAME, opt)?,
            eta_min,
        };
        s.initial_step(opt)?;
        Ok(s)
    }
}

impl Chainable for CosineAnnealingLR {
    const NAME: &'static str = "CosineAnnealingLR";
    core_accessors!();
    fn get_lr(&mut self, opt: &mut dyn ParamGroupLr) -> Result<Vec<f64>> {
        let e = self.core.last_epoch;
        let t = self.t_max as f64;
        let eta = self.eta_min;
        let lrs = group_lrs(opt);
        if self.core.initial {
            return Ok(lrs);
        }
        if self.core.step_count == 1 && e > 0 {
            let c = 1.0 + (e as f64 * PI / t).cos();
            return Ok(self
                .core
                .base_lrs
                .iter()
                .map(|b| eta + (b - eta) * c / 2.0)
                .collect());
        }
        if (e - 1 - self.t_max).rem_euclid(2 * self.t_max) == 0 {
            let c = 1.0 - (PI / t).cos();
            return Ok(lrs
                .iter()
                .zip(&self.core.base_lrs)
                .map(|(lr, b)| lr + (b - eta) * c / 2.0)
                .collect());
        }
        let ratio = (1.0 + (PI * e as f64 / t).cos()) / (1.0 + (PI * (e - 1) as f64 / t).cos());
        Ok(lrs.into_iter().map(|lr| ratio * (lr - eta) + eta).collect())
    }
    fn closed_form_lr(&self) -> Option<Vec<f64>> {
        let c = 1.0 + (PI * self.core.last_epoch as f64 / self.t_max as f64).cos();
        let eta = self.eta_min;
        Some(
            self.core
                .base_lrs
                .iter()
                .map(|b| eta + (b - eta) * c / 2.0)
                .collect(),
        )
    }
    whole_struct_state!();
}
impl_lr_scheduler!(CosineAnnealingLR);

impl ValidState for CosineAnnealingLR {
    fn validate(&self, live: &Self) -> Result<()> {
        let c = Check(Self::NAME);
        c.core(&self.core, &live.core)?;
        c.count("t_max", self.t_max, 1)?;
        c.finite("eta_min", self.eta_min)
    }
}

impl ValidState for CosineAnnealingWarmRestarts {
    fn validate(&self, live: &Self) -> Result<()> {
        let c = Check(Self::NAME);
        c.core(&self.core, &live.core)?;
        let max = MAX_EPOCH as f64;
        let whole = |v: f64| v.fract() == 0.0;
        c.that(
            self.t_0 >= 1.0 && self.t_0 <= max && whole(self.t_0),
            "t_0",
            self.t_0,
            "must be a whole number of epochs >= 1",
        )?;
        c.that(
            self.t_mult >= 1.0 && self.t_mult <= max && whole(self.t_mult),
            "t_mult",
            self.t_mult,
            "must be a whole number >= 1",
        )?;
        c.that(
            self.t_i.is_finite() && self.t_i >= self.t_0,
            "t_i",
            self.t_i,
            "must be a finite period of at least t_0",
        )?;
        c.that(
            self.t_cur.is_finite() && self.t_cur >= -1.0,
            "t_cur",
            self.t_cur,
            "must be a finite epoch count >= -1",
        )?;
        c.finite("eta_min", self.eta_min)
    }
}

/// Cosine annealing with warm restarts (SGDR): the lr follows a half cosine from the base lr
/// to `eta_min` over `T_0` epochs, restarts, and each period is `T_mult` times the previous
/// (PyTorch `CosineAnnealingWarmRestarts`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CosineAnnealingWarmRestarts {
    core: Core,
    t_0: f64,
    t_i: f64,
    t_mult: f64,
    eta_min: f64,
    t_cur: f64,
}

impl CosineAnnealingWarmRestarts {
    /// Attach to `opt`. PyTorch's defaults are `t_mult = 1`, `eta_min = 0.0`. Errors when
    /// `t_0` or `t_mult` is 0 or `eta_min` is not finite.
    pub fn new(
        opt: &mut dyn ParamGroupLr,
        t_0: usize,
        t_mult: usize,
        eta_min: f64,
    ) -> Result<Self> {
        if t_0 == 0 {
            return Err(invalid(
                Self::NAME,
                "T_0",
                0,
                "use a first period of at least 1 epoch",
            ));
        }
        if t_mult == 0 {
            return Err(invalid(
                Self::NAME,
                "T_mult",
                0,
                "use an integer >= 1 (1 keeps every period T_0 long)",
            ));
        }
        check_eta_min(Self::NAME, eta_min)?;
        let t_0 = crate::state_check::epochs(Self::NAME, "T_0", t_0)? as f64;
        let t_mult = crate::state_check::epochs(Self::NAME, "T_mult", t_mult)? as f64;
        let mut s = Self {
            core: Core::attach(Self::NAME, opt)?,
            t_0,
            t_i: t_0,
            t_mult,
            eta_min,
            t_cur: -1.0,
        };
        s.initial_step(opt)?;
        Ok(s)
    }

    /// Jump to a (possibly fractional) epoch, e.g. `epoch + batch / batches_per_epoch` after
    /// every batch (PyTorch `step(epoch)`). Errors when `epoch` is negative, not finite, or
    /// beyond 2^53 (where epoch counters stop being exact).
    pub fn step_to(&mut self, opt: &mut dyn ParamGroupLr, epoch: f64) -> Result<()> {
        if !(epoch >= 0.0 && epoch <= MAX_EPOCH as f64) {
            return Err(invalid(
                Self::NAME,
                "epoch",
                epoch,
                "pass a non-negative (possibly fractional) epoch of at most 2^53",
            ));
        }
        self.core.check_groups(Self::NAME, opt)?;
        let saved = self.clone();
        self.set_epoch(epoch);
        let r = self.apply(opt);
        if r.is_err() {
            *self = saved;
        }
        r
    }

    fn set_epoch(&mut self, epoch: f64) {
        if epoch >= self.t_0 {
            if self.t_mult == 1.0 {
                self.t_cur = epoch % self.t_0;
            } else {
                let x = epoch / self.t_0 * (self.t_mult - 1.0) + 1.0;
                let n = (x.ln() / self.t_mult.ln()).trunc();
                let mult_n = self.t_mult.powf(n);
                self.t_cur = epoch - self.t_0 * (mult_n - 1.0) / (self.t_mult - 1.0);
                self.t_i = self.t_0 * mult_n;
            }
        } else {
            self.t_i = self.t_0;
            self.t_cur = epoch;
        }
        self.core.last_epoch = epoch.floor() as i64;
    }

    /// Writes the lrs for the current `t_cur`; on a refusal the optimizer is restored and the
    /// caller restores `self` (see `step`, `step_to`).
    fn apply(&mut self, opt: &mut dyn ParamGroupLr) -> Result<()> {
        let before = GroupSnapshot::take(opt);
        let lrs = self.get_lr(opt)?;
        write_lrs(Self::NAME, opt, lrs, &before)?;
        self.core.last_lr = group_lrs(opt);
        Ok(())
    }
}

impl Chainable for CosineAnnealingWarmRestarts {
    const NAME: &'static str = "CosineAnnealingWarmRestarts";
    core_accessors!();
    fn get_lr(&mut self, _opt: &mut dyn ParamGroupLr) -> Result<Vec<f64>> {
        let c = 1.0 + (PI * self.t_cur / self.t_i).cos();
        let eta = self.eta_min;
        Ok(self
            .core
            .base_lrs
            .iter()
            .map(|b| eta + (b - eta) * c / 2.0)
            .collect())
    }
    whole_struct_state!();
}

impl LrScheduler for CosineAnnealingWarmRestarts {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn step(&mut self, opt: &mut dyn ParamGroupLr) -> Result<()> {
        self.core.check_groups(Self::NAME, opt)?;
        let saved = self.clone();
        let r = self.advance(opt);
        if r.is_err() {
            *self = saved;
        }
        r
    }
    fn get_last_lr(&self) -> &[f64] {
        &self.core.last_lr
    }
    fn last_epoch(&self) -> i64 {
        self.core.last_epoch
    }
    fn state_dict(&self) -> serde_json::Value {
        tagged(Self::NAME, self.save())
    }
    fn load_state_dict(&mut self, state: &serde_json::Value) -> Result<()> {
        let loaded: Self = from_state(Self::NAME, untag(Self::NAME, state)?)?;
        loaded.validate(self)?;
        *self = loaded;
        Ok(())
    }
    fn initial_step(&mut self, opt: &mut dyn ParamGroupLr) -> Result<()> {
        self.core.step_count = 0;
        self.core.initial = true;
        let r = self.step(opt);
        self.core.initial = false;
        r
    }
    fn jump_to_epoch(&mut self, opt: &mut dyn ParamGroupLr, epoch: i64) -> Result<()> {
        crate::scheduler::update_lr(self, opt, Some(epoch))
    }
    fn undo_last_epoch(&mut self) {
        self.core.last_epoch -= 1;
    }
}

impl CosineAnnealingWarmRestarts {
    /// One epoch forward (PyTorch `step()` without an epoch).
    fn advance(&mut self, opt: &mut dyn ParamGroupLr) -> Result<()> {
        if self.core.last_epoch < 0 {
            self.set_epoch(0.0);
        } else {
            self.core.last_epoch += 1;
            self.t_cur += 1.0;
            if self.t_cur >= self.t_i {
                self.t_cur %= self.t_i;
                self.t_i *= self.t_mult;
            }
        }
        self.apply(opt)
    }
}
