//! The scheduler traits and the shared "chainable" stepping machinery.
//!
//! PyTorch's `LRScheduler` keeps `base_lrs`, `last_epoch`, `_step_count` and `_last_lr`, and a
//! `step()` that bumps `last_epoch` and writes `get_lr()` into every parameter group. Most
//! schedulers' `get_lr()` is *recursive* ("chainable"): the new lr is computed from the lr the
//! group has *now*, not from a closed form, so that several schedulers can act on the same
//! groups (ChainedScheduler) or hand over to each other (SequentialLR). Reproducing PyTorch's
//! sequences bit for bit therefore means reproducing the recursion and its floating-point order,
//! not the textbook formula; each scheduler's `get_lr` below follows PyTorch's expression order.
//!
//! Three pieces:
//! - [`Core`]: the state every step-driven scheduler shares (serialized in its state dict);
//! - the crate-private `Chainable` trait: what a concrete scheduler adds (`get_lr`, and the
//!   closed form used when SequentialLR jumps a scheduler to epoch 0);
//! - [`LrScheduler`] (step-driven) and [`MetricScheduler`] (metric-driven, ReduceLROnPlateau):
//!   two traits, so passing a metric to a scheduler that takes none, or none to one that needs
//!   it, does not compile.
//!
//! A failed step (e.g. OneCycleLR past `total_steps`, or an optimizer refusing a value)
//! leaves both the scheduler and the optimizer unchanged: [`GroupSnapshot`] records the groups'
//! lrs and momenta before a step and puts them back on failure. A loaded state dict is
//! validated (ranges, finiteness, lengths against the live scheduler's groups) before any of it
//! replaces the live state; see `state_check.rs`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Result, SchedError};
use crate::param_group::ParamGroupLr;

/// A step-driven learning-rate scheduler (every PyTorch scheduler except ReduceLROnPlateau).
///
/// Call [`step`](LrScheduler::step) once per epoch (or per batch, for OneCycleLR and
/// CyclicLR) after the optimizer's step, passing the same optimizer every time.
pub trait LrScheduler: Send {
    /// The PyTorch class name, e.g. `"StepLR"`.
    fn name(&self) -> &'static str;
    /// Advance one epoch and write the new lr into every parameter group.
    fn step(&mut self, opt: &mut dyn ParamGroupLr) -> Result<()>;
    /// The lrs this scheduler last wrote, one per group (PyTorch `get_last_lr()`).
    fn get_last_lr(&self) -> &[f64];
    /// The epoch counter (PyTorch `last_epoch`): 0 right after construction.
    fn last_epoch(&self) -> i64;
    /// Everything needed to resume: load it into a scheduler built with the same arguments
    /// (and restore the optimizer's lrs) and the sequence continues identically.
    fn state_dict(&self) -> Value;
    /// Restore a [`state_dict`](LrScheduler::state_dict).
    fn load_state_dict(&mut self, state: &Value) -> Result<()>;
    /// PyTorch `_initial_step`: reset the step count and take the construction-time step.
    /// Called by constructors and by [`SequentialLR`](crate::SequentialLR); rarely by users.
    fn initial_step(&mut self, opt: &mut dyn ParamGroupLr) -> Result<()>;
    /// PyTorch `_update_lr(epoch)`: set `last_epoch = epoch` and write the closed-form lr where
    /// the scheduler has one (else its recursive `get_lr`). SequentialLR calls it with 0 at a
    /// milestone.
    fn jump_to_epoch(&mut self, opt: &mut dyn ParamGroupLr, epoch: i64) -> Result<()>;
    /// PyTorch `SequentialLR.recursive_undo`: decrement `last_epoch` (recursing into composed
    /// schedulers), undoing the construction-time step.
    fn undo_last_epoch(&mut self);
}

/// A metric-driven scheduler: ReduceLROnPlateau.
pub trait MetricScheduler: Send {
    /// The PyTorch class name.
    fn name(&self) -> &'static str;
    /// Feed one epoch's metric (e.g. validation loss) and update the lrs.
    fn step(&mut self, opt: &mut dyn ParamGroupLr, metric: f64) -> Result<()>;
    /// The lrs after the last step, one per group.
    fn get_last_lr(&self) -> &[f64];
    /// Everything needed to resume.
    fn state_dict(&self) -> Value;
    /// Restore a [`state_dict`](MetricScheduler::state_dict).
    fn load_state_dict(&mut self, state: &Value) -> Result<()>;
}

/// State shared by every step-driven scheduler (PyTorch `LRScheduler`'s attributes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Core {
    /// Per-group base lrs (the groups' `initial_lr` when the scheduler was built).
    pub base_lrs: Vec<f64>,
    /// PyTorch `last_epoch`.
    pub last_epoch: i64,
    /// PyTorch `_step_count`.
    pub step_count: i64,
    /// PyTorch `_last_lr`.
    pub last_lr: Vec<f64>,
    /// PyTorch `_is_initial`: true only inside the construction-time step.
    #[serde(skip)]
    pub initial: bool,
}

impl Core {
    /// Attach to `opt`: record `initial_lr` in groups that have none (PyTorch `setdefault`) and
    /// take the groups' `initial_lr` as base lrs.
    pub(crate) fn attach(scheduler: &'static str, opt: &mut dyn ParamGroupLr) -> Result<Self> {
        let n = opt.num_lr_groups();
        if n == 0 {
            return Err(SchedError::NoGroups { scheduler });
        }
        let mut base_lrs = Vec::with_capacity(n);
        for g in 0..n {
            let initial = match opt.group_initial_lr(g) {
                Some(lr) => lr,
                None => {
                    let lr = opt.group_lr(g);
                    opt.set_group_initial_lr(g, lr)?;
                    lr
                }
            };
            base_lrs.push(initial);
        }
        Ok(Self {
            last_lr: group_lrs(opt),
            base_lrs,
            last_epoch: -1,
            step_count: 0,
            initial: false,
        })
    }

    /// Error unless `opt` still has as many groups as when the scheduler was built.
    pub(crate) fn check_groups(
        &self,
        scheduler: &'static str,
        opt: &dyn ParamGroupLr,
    ) -> Result<()> {
        check_group_count(scheduler, self.base_lrs.len(), opt)
    }
}

pub(crate) fn check_group_count(
    scheduler: &'static str,
    expected: usize,
    opt: &dyn ParamGroupLr,
) -> Result<()> {
    if opt.num_lr_groups() == expected {
        Ok(())
    } else {
        Err(SchedError::GroupCountMismatch {
            scheduler,
            parameter: "optimizer.param_groups",
            expected: opt.num_lr_groups(),
            got: expected,
        })
    }
}

/// The current lr of every group.
pub(crate) fn group_lrs(opt: &dyn ParamGroupLr) -> Vec<f64> {
    (0..opt.num_lr_groups()).map(|g| opt.group_lr(g)).collect()
}

/// Every group's lr and momentum, to undo a step that failed half-way.
pub(crate) struct GroupSnapshot {
    lrs: Vec<f64>,
    momenta: Vec<Option<f64>>,
}

impl GroupSnapshot {
    pub(crate) fn take(opt: &dyn ParamGroupLr) -> Self {
        let n = opt.num_lr_groups();
        Self {
            lrs: group_lrs(opt),
            momenta: (0..n).map(|g| opt.group_momentum(g)).collect(),
        }
    }

    /// Writes the recorded values back. They were in the optimizer a moment ago, so it takes
    /// them again; a refusal here could only repeat the error being reported, so it is dropped.
    pub(crate) fn restore(&self, opt: &mut dyn ParamGroupLr) {
        for (g, &lr) in self.lrs.iter().enumerate() {
            let _ = opt.set_group_lr(g, lr);
        }
        for (g, m) in self.momenta.iter().enumerate() {
            if let Some(m) = *m {
                let _ = opt.set_group_momentum(g, m);
            }
        }
    }
}

/// Writes `values` as the groups' lrs, undoing every write of this step (lrs and momenta, from
/// `before`) when one is not finite or the optimizer refuses one.
pub(crate) fn write_lrs(
    scheduler: &'static str,
    opt: &mut dyn ParamGroupLr,
    values: Vec<f64>,
    before: &GroupSnapshot,
) -> Result<()> {
    if let Some((group, &value)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        before.restore(opt);
        return Err(SchedError::NonFiniteLr {
            scheduler,
            group,
            value,
        });
    }
    for (g, lr) in values.into_iter().enumerate() {
        if let Err(e) = opt.set_group_lr(g, lr) {
            before.restore(opt);
            return Err(e);
        }
    }
    Ok(())
}

/// What a concrete chainable scheduler provides; the rest of [`LrScheduler`] is generic.
pub(crate) trait Chainable {
    const NAME: &'static str;
    fn core(&self) -> &Core;
    fn core_mut(&mut self) -> &mut Core;
    /// PyTorch `get_lr()`: the lrs for `core().last_epoch`, usually from the groups' current lrs.
    /// May also write momentum into `opt` (OneCycleLR, CyclicLR).
    fn get_lr(&mut self, opt: &mut dyn ParamGroupLr) -> Result<Vec<f64>>;
    /// PyTorch `_get_closed_form_lr()`, where the scheduler has one.
    fn closed_form_lr(&self) -> Option<Vec<f64>> {
        None
    }
    fn save(&self) -> Value;
    fn restore(&mut self, state: Value) -> Result<()>;
}

/// PyTorch `_update_lr(epoch)`: advance (or jump) `last_epoch` and write the new lrs. Restores
/// the previous state when `get_lr` fails.
pub(crate) fn update_lr<S: Chainable>(
    s: &mut S,
    opt: &mut dyn ParamGroupLr,
    epoch: Option<i64>,
) -> Result<()> {
    s.core().check_groups(S::NAME, opt)?;
    let before = GroupSnapshot::take(opt);
    let saved_epoch = s.core().last_epoch;
    let values = match epoch {
        None => {
            s.core_mut().last_epoch += 1;
            s.get_lr(opt)
        }
        Some(e) => {
            s.core_mut().last_epoch = e;
            match s.closed_form_lr() {
                Some(v) => Ok(v),
                None => s.get_lr(opt),
            }
        }
    };
    let values = match values {
        Ok(v) => v,
        Err(e) => {
            s.core_mut().last_epoch = saved_epoch;
            before.restore(opt);
            return Err(e);
        }
    };
    if let Err(e) = write_lrs(S::NAME, opt, values, &before) {
        s.core_mut().last_epoch = saved_epoch;
        return Err(e);
    }
    s.core_mut().last_lr = group_lrs(opt);
    Ok(())
}

/// Wrap a scheduler's serialized state with its type name, so loading a StepLR's state into an
/// ExponentialLR is an error rather than garbage.
pub(crate) fn tagged(name: &'static str, state: Value) -> Value {
    serde_json::json!({ "scheduler": name, "state": state })
}

/// Inverse of [`tagged`].
pub(crate) fn untag(name: &'static str, state: &Value) -> Result<Value> {
    let got = state.get("scheduler").and_then(Value::as_str);
    if got != Some(name) {
        return Err(SchedError::State {
            scheduler: name,
            reason: format!(
                "it was saved by {:?}",
                got.unwrap_or("<not a scheduler state>")
            ),
        });
    }
    state
        .get("state")
        .cloned()
        .ok_or_else(|| SchedError::State {
            scheduler: name,
            reason: "it has no \"state\" entry".into(),
        })
}

pub(crate) fn from_state<T: serde::de::DeserializeOwned>(
    name: &'static str,
    v: Value,
) -> Result<T> {
    serde_json::from_value(v).map_err(|e| SchedError::State {
        scheduler: name,
        reason: e.to_string(),
    })
}

/// `core`/`core_mut` for schedulers that keep their [`Core`] in a field named `core`.
macro_rules! core_accessors {
    () => {
        fn core(&self) -> &$crate::scheduler::Core {
            &self.core
        }
        fn core_mut(&mut self) -> &mut $crate::scheduler::Core {
            &mut self.core
        }
    };
}
pub(crate) use core_accessors;

/// Implement [`LrScheduler`] for a [`Chainable`] type.
macro_rules! impl_lr_scheduler {
    ($ty:ty) => {
        impl $crate::scheduler::LrScheduler for $ty {
            fn name(&self) -> &'static str {
                <Self as $crate::scheduler::Chainable>::NAME
            }
            fn step(&mut self, opt: &mut dyn $crate::ParamGroupLr) -> $crate::error::Result<()> {
                use $crate::scheduler::Chainable;
                self.core_mut().step_count += 1;
                let r = $crate::scheduler::update_lr(self, opt, None);
                if r.is_err() {
                    self.core_mut().step_count -= 1;
                }
                r
            }
            fn get_last_lr(&self) -> &[f64] {
                &$crate::scheduler::Chainable::core(self).last_lr
            }
            fn last_epoch(&self) -> i64 {
                $crate::scheduler::Chainable::core(self).last_epoch
            }
            fn state_dict(&self) -> serde_json::Value {
                $crate::scheduler::tagged(
                    <Self as $crate::scheduler::Chainable>::NAME,
                    $crate::scheduler::Chainable::save(self),
                )
            }
            fn load_state_dict(&mut self, state: &serde_json::Value) -> $crate::error::Result<()> {
                let inner =
                    $crate::scheduler::untag(<Self as $crate::scheduler::Chainable>::NAME, state)?;
                $crate::scheduler::Chainable::restore(self, inner)
            }
            fn initial_step(
                &mut self,
                opt: &mut dyn $crate::ParamGroupLr,
            ) -> $crate::error::Result<()> {
                use $crate::scheduler::Chainable;
                self.core_mut().step_count = 0;
                self.core_mut().initial = true;
                let r = $crate::scheduler::LrScheduler::step(self, opt);
                self.core_mut().initial = false;
                r
            }
            fn jump_to_epoch(
                &mut self,
                opt: &mut dyn $crate::ParamGroupLr,
                epoch: i64,
            ) -> $crate::error::Result<()> {
                $crate::scheduler::update_lr(self, opt, Some(epoch))
            }
            fn undo_last_epoch(&mut self) {
                $crate::scheduler::Chainable::core_mut(self).last_epoch -= 1;
            }
        }
    };
}
pub(crate) use impl_lr_scheduler;

/// Serialize f64 so that infinities and NaN survive JSON (serde_json writes them as `null`).
pub(crate) mod nonfinite_f64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f64(*v)
        } else if v.is_nan() {
            s.serialize_str("nan")
        } else if *v > 0.0 {
            s.serialize_str("inf")
        } else {
            s.serialize_str("-inf")
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum NumOrText {
        Num(f64),
        Text(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        match NumOrText::deserialize(d)? {
            NumOrText::Num(v) => Ok(v),
            NumOrText::Text(t) => match t.as_str() {
                "nan" => Ok(f64::NAN),
                "inf" => Ok(f64::INFINITY),
                "-inf" => Ok(f64::NEG_INFINITY),
                other => Err(serde::de::Error::custom(format!("not a number: {other:?}"))),
            },
        }
    }
}
