//! ReduceLROnPlateau: cut the lr when a metric stops improving.
//!
//! The only metric-driven scheduler, so it implements [`MetricScheduler`] (step takes the
//! metric) and not [`LrScheduler`](crate::LrScheduler): forgetting the metric, or passing one
//! to StepLR, does not compile. As in PyTorch a NaN metric is never "better", so it counts as
//! a bad epoch; the best value so far (initially +/- infinity) survives the state dict.

use serde::{Deserialize, Serialize};

use crate::error::{invalid, Result, SchedError};
use crate::param_group::{ParamGroupLr, PerGroup};
use crate::scheduler::{
    from_state, group_lrs, nonfinite_f64, tagged, untag, write_lrs, GroupSnapshot, MetricScheduler,
};
use crate::state_check::{Check, ValidState};

/// Whether lower or higher metric values are better (PyTorch `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PlateauMode {
    /// Lower is better (a loss).
    Min,
    /// Higher is better (an accuracy).
    Max,
}

/// How `threshold` measures a significant improvement (PyTorch `threshold_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ThresholdMode {
    /// Relative: better than `best * (1 -/+ threshold)`.
    Rel,
    /// Absolute: better than `best -/+ threshold`.
    Abs,
}

/// Options of [`ReduceLROnPlateau`] (PyTorch keyword arguments and defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlateauOptions {
    /// Default min.
    pub mode: PlateauMode,
    /// New lr = lr * factor (default 0.1), in (0, 1).
    pub factor: f64,
    /// Bad epochs tolerated before a cut (default 10).
    pub patience: usize,
    /// Significant-improvement threshold (default 1e-4).
    pub threshold: f64,
    /// Default rel.
    pub threshold_mode: ThresholdMode,
    /// Epochs to wait after a cut before counting bad epochs again (default 0).
    pub cooldown: usize,
    /// Lower bound of the lr, for all groups or per group (default 0).
    pub min_lr: PerGroup,
    /// Cuts smaller than this are skipped (default 1e-8).
    pub eps: f64,
}

impl Default for PlateauOptions {
    fn default() -> Self {
        Self {
            mode: PlateauMode::Min,
            factor: 0.1,
            patience: 10,
            threshold: 1e-4,
            threshold_mode: ThresholdMode::Rel,
            cooldown: 0,
            min_lr: PerGroup::All(0.0),
            eps: 1e-8,
        }
    }
}

/// Reduce every group's lr by `factor` once the metric has not improved for `patience`
/// epochs (PyTorch `ReduceLROnPlateau`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReduceLROnPlateau {
    mode: PlateauMode,
    threshold_mode: ThresholdMode,
    factor: f64,
    patience: usize,
    threshold: f64,
    cooldown: usize,
    min_lrs: Vec<f64>,
    default_min_lr: Option<f64>,
    eps: f64,
    #[serde(with = "nonfinite_f64")]
    best: f64,
    cooldown_counter: usize,
    num_bad_epochs: usize,
    last_epoch: i64,
    last_lr: Vec<f64>,
}

impl ReduceLROnPlateau {
    /// Attach to `opt`. Errors when `factor` is outside (0, 1), `threshold` or `eps` is
    /// negative or not finite, `min_lr` is negative or has the wrong number of groups, or
    /// `cooldown` is beyond 2^53.
    pub fn new(opt: &mut dyn ParamGroupLr, options: PlateauOptions) -> Result<Self> {
        let n = opt.num_lr_groups();
        if n == 0 {
            return Err(SchedError::NoGroups {
                scheduler: Self::NAME,
            });
        }
        if !(options.factor > 0.0 && options.factor < 1.0) {
            return Err(invalid(
                Self::NAME,
                "factor",
                options.factor,
                "use a reduction factor in (0, 1), e.g. 0.1",
            ));
        }
        for (name, v) in [("threshold", options.threshold), ("eps", options.eps)] {
            if !(v >= 0.0 && v.is_finite()) {
                return Err(invalid(Self::NAME, name, v, "use a finite value >= 0"));
            }
        }
        let default_min_lr = match options.min_lr {
            PerGroup::All(v) => Some(v),
            PerGroup::Each(_) => None,
        };
        let min_lrs = options.min_lr.resolve(Self::NAME, "min_lr", n)?;
        if let Some(v) = min_lrs.iter().find(|&&v| v < 0.0) {
            return Err(invalid(Self::NAME, "min_lr", v, "use a lower bound >= 0"));
        }
        crate::state_check::epochs(Self::NAME, "cooldown", options.cooldown)?;
        let mut s = Self {
            mode: options.mode,
            threshold_mode: options.threshold_mode,
            factor: options.factor,
            patience: options.patience,
            threshold: options.threshold,
            cooldown: options.cooldown,
            min_lrs,
            default_min_lr,
            eps: options.eps,
            best: 0.0,
            cooldown_counter: 0,
            num_bad_epochs: 0,
            last_epoch: 0,
            last_lr: group_lrs(opt),
        };
        s.reset();
        Ok(s)
    }

    const NAME: &'static str = "ReduceLROnPlateau";

    fn reset(&mut self) {
        self.best = match self.mode {
            PlateauMode::Min => f64::INFINITY,
            PlateauMode::Max => f64::NEG_INFINITY,
        };
        self.cooldown_counter = 0;
        self.num_bad_epochs = 0;
    }

    fn is_better(&self, a: f64, best: f64) -> bool {
        match (self.mode, self.threshold_mode) {
            (PlateauMode::Min, ThresholdMode::Rel) => a < best * (1.0 - self.threshold),
            (PlateauMode::Min, ThresholdMode::Abs) => a < best - self.threshold,
            (PlateauMode::Max, ThresholdMode::Rel) => a > best * (self.threshold + 1.0),
            (PlateauMode::Max, ThresholdMode::Abs) => a > best + self.threshold,
        }
    }

    /// The best metric seen so far.
    pub fn best(&self) -> f64 {
        self.best
    }

    /// Consecutive epochs without improvement.
    pub fn num_bad_epochs(&self) -> usize {
        self.num_bad_epochs
    }

    /// Epochs stepped so far.
    pub fn last_epoch(&self) -> i64 {
        self.last_epoch
    }

    fn reduce_lr(&mut self, opt: &mut dyn ParamGroupLr) -> Result<()> {
        let n = opt.num_lr_groups();
        if n != self.min_lrs.len() {
            match self.default_min_lr {
                Some(v) => self.min_lrs = vec![v; n],
                None => {
                    return Err(SchedError::GroupCountMismatch {
                        scheduler: Self::NAME,
                        parameter: "min_lr",
                        expected: n,
                        got: self.min_lrs.len(),
                    })
                }
            }
        }
        let before = GroupSnapshot::take(opt);
        let mut lrs = group_lrs(opt);
        for (lr, &min_lr) in lrs.iter_mut().zip(&self.min_lrs) {
            let new = (*lr * self.factor).max(min_lr);
            if *lr - new > self.eps {
                *lr = new;
            }
        }
        write_lrs(Self::NAME, opt, lrs, &before)
    }
}

impl MetricScheduler for ReduceLROnPlateau {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn step(&mut self, opt: &mut dyn ParamGroupLr, metric: f64) -> Result<()> {
        if opt.num_lr_groups() != self.min_lrs.len() && self.default_min_lr.is_none() {
            return Err(SchedError::GroupCountMismatch {
                scheduler: Self::NAME,
                parameter: "min_lr",
                expected: opt.num_lr_groups(),
                got: self.min_lrs.len(),
            });
        }
        let saved = self.clone();
        let r = self.advance(opt, metric);
        if r.is_err() {
            *self = saved;
        }
        r
    }

    fn get_last_lr(&self) -> &[f64] {
        &self.last_lr
    }

    fn state_dict(&self) -> serde_json::Value {
        tagged(
            Self::NAME,
            serde_json::to_value(self).expect("state serializes"),
        )
    }

    fn load_state_dict(&mut self, state: &serde_json::Value) -> Result<()> {
        let loaded: Self = from_state(Self::NAME, untag(Self::NAME, state)?)?;
        loaded.validate(self)?;
        *self = loaded;
        Ok(())
    }
}

impl ValidState for ReduceLROnPlateau {
    fn validate(&self, live: &Self) -> Result<()> {
        let c = Check(Self::NAME);
        let groups = live.last_lr.len();
        c.that(
            self.factor > 0.0 && self.factor < 1.0,
            "factor",
            self.factor,
            "must be in (0, 1)",
        )?;
        c.non_negative("threshold", self.threshold)?;
        c.non_negative("eps", self.eps)?;
        c.that(
            !self.best.is_nan(),
            "best",
            self.best,
            "must be a number (or +/-inf)",
        )?;
        if let Some(v) = self.default_min_lr {
            c.non_negative("default_min_lr", v)?;
        }
        c.per_group(
            "min_lrs",
            &self.min_lrs,
            live.min_lrs.len(),
            Check::non_negative,
        )?;
        c.per_group("last_lr", &self.last_lr, groups, Check::finite)?;
        let counter = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        c.count("num_bad_epochs", counter(self.num_bad_epochs), 0)?;
        c.count("cooldown_counter", counter(self.cooldown_counter), 0)?;
        c.count("last_epoch", self.last_epoch, 0)
    }
}

impl ReduceLROnPlateau {
    /// One metric step; on an error `step` puts the previous state back.
    fn advance(&mut self, opt: &mut dyn ParamGroupLr, metric: f64) -> Result<()> {
        self.last_epoch += 1;
        if self.is_better(metric, self.best) {
            self.best = metric;
            self.num_bad_epochs = 0;
        } else {
            self.num_bad_epochs += 1;
        }
        if self.cooldown_counter > 0 {
            self.cooldown_counter -= 1;
            self.num_bad_epochs = 0;
        }
        if self.num_bad_epochs > self.patience {
            self.reduce_lr(opt)?;
            self.cooldown_counter = self.cooldown;
            self.num_bad_epochs = 0;
        }
        self.last_lr = group_lrs(opt);
        Ok(())
    }
}
