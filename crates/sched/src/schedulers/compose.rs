//! Composition: SequentialLR (one scheduler after another, e.g. warm-up then decay) and
//! ChainedScheduler (several schedulers multiplying their effects every step).
//!
//! Both rely on the chainable rules: every scheduler built on one optimizer shares the groups'
//! `initial_lr` and updates the lr the groups have *now*. SequentialLR reproduces PyTorch's
//! construction exactly: reset every group to `initial_lr`, undo the construction step of every
//! child (`last_epoch -= 1`), redo the first child's initial step; at a milestone the next child
//! jumps to epoch 0 through its closed form. Children must have been built on the same
//! optimizer that is passed to `step` (Rust cannot check that; PyTorch does).

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::error::{invalid, Result, SchedError};
use crate::param_group::ParamGroupLr;
use crate::scheduler::{from_state, group_lrs, tagged, untag, LrScheduler};
use crate::state_check::Check;

fn check_not_empty(scheduler: &'static str, n: usize) -> Result<()> {
    if n == 0 {
        Err(invalid(
            scheduler,
            "schedulers",
            "[]",
            "pass at least one scheduler built on the optimizer",
        ))
    } else {
        Ok(())
    }
}

fn load_children(
    scheduler: &'static str,
    children: &mut [Box<dyn LrScheduler>],
    states: &Value,
) -> Result<()> {
    let states = states.as_array().ok_or_else(|| SchedError::State {
        scheduler,
        reason: "\"schedulers\" is not a list".into(),
    })?;
    if states.len() != children.len() {
        return Err(SchedError::State {
            scheduler,
            reason: format!(
                "it holds {} child states but this scheduler has {} children",
                states.len(),
                children.len()
            ),
        });
    }
    // All or nothing: a child that refuses its state puts back the children loaded before it.
    let before: Vec<Value> = children.iter().map(|c| c.state_dict()).collect();
    for (i, (child, state)) in children.iter_mut().zip(states).enumerate() {
        if let Err(e) = child.load_state_dict(state) {
            for (c, old) in children.iter_mut().zip(&before).take(i) {
                // The state was this child's own a moment ago, so it loads again.
                let _ = c.load_state_dict(old);
            }
            return Err(e);
        }
    }
    Ok(())
}

/// The last lrs of a composed scheduler: one finite value per group of its first child.
fn check_last_lr(c: Check, last_lr: &[f64], children: &[Box<dyn LrScheduler>]) -> Result<()> {
    let groups = children.first().map_or(0, |s| s.get_last_lr().len());
    c.per_group("last_lr", last_lr, groups, Check::finite)
}

#[derive(Serialize, Deserialize)]
struct SequentialState {
    last_epoch: i64,
    milestones: Vec<i64>,
    last_lr: Vec<f64>,
    schedulers: Value,
}

/// Run `schedulers[i]` from `milestones[i - 1]` on (PyTorch `SequentialLR`).
pub struct SequentialLR {
    schedulers: Vec<Box<dyn LrScheduler>>,
    milestones: Vec<i64>,
    last_epoch: i64,
    last_lr: Vec<f64>,
}

impl std::fmt::Debug for SequentialLR {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<_> = self.schedulers.iter().map(|s| s.name()).collect();
        f.debug_struct("SequentialLR")
            .field("schedulers", &names)
            .field("milestones", &self.milestones)
            .field("last_epoch", &self.last_epoch)
            .finish()
    }
}

impl SequentialLR {
    const NAME: &'static str = "SequentialLR";

    /// Compose `schedulers`, all built on `opt`, switching at the strictly increasing
    /// `milestones` (one fewer than schedulers). ReduceLROnPlateau cannot be a child: it is not
    /// an [`LrScheduler`], so that does not compile.
    pub fn new(
        opt: &mut dyn ParamGroupLr,
        schedulers: Vec<Box<dyn LrScheduler>>,
        milestones: &[usize],
    ) -> Result<Self> {
        check_not_empty(Self::NAME, schedulers.len())?;
        if milestones.len() + 1 != schedulers.len() {
            return Err(invalid(
                Self::NAME,
                "milestones",
                format!("{milestones:?}"),
                format!(
                    "give exactly one milestone fewer than schedulers ({} schedulers need {})",
                    schedulers.len(),
                    schedulers.len() - 1
                ),
            ));
        }
        if milestones.windows(2).any(|w| w[0] >= w[1]) {
            return Err(invalid(
                Self::NAME,
                "milestones",
                format!("{milestones:?}"),
                "list the switch epochs in strictly increasing order",
            ));
        }
        let milestones = milestones
            .iter()
            .map(|&m| crate::state_check::epochs(Self::NAME, "milestones", m))
            .collect::<Result<Vec<_>>>()?;
        for g in 0..opt.num_lr_groups() {
            let initial = opt
                .group_initial_lr(g)
                .ok_or(SchedError::MissingInitialLr {
                    scheduler: Self::NAME,
                    group: g,
                })?;
            opt.set_group_lr(g, initial)?;
        }
        let mut s = Self {
            schedulers,
            milestones,
            last_epoch: 0,
            last_lr: Vec::new(),
        };
        s.undo_last_epoch();
        let idx = s.milestones.partition_point(|&m| m <= 0);
        s.schedulers[idx].initial_step(opt)?;
        s.last_lr = s.schedulers[idx].get_last_lr().to_vec();
        Ok(s)
    }
}

impl LrScheduler for SequentialLR {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn step(&mut self, opt: &mut dyn ParamGroupLr) -> Result<()> {
        let epoch = self.last_epoch + 1;
        let idx = self.milestones.partition_point(|&m| m <= epoch);
        let child = &mut self.schedulers[idx];
        if idx > 0 && self.milestones[idx - 1] == epoch {
            child.jump_to_epoch(opt, 0)?;
        } else {
            child.step(opt)?;
        }
        self.last_lr = child.get_last_lr().to_vec();
        self.last_epoch = epoch;
        Ok(())
    }
    fn get_last_lr(&self) -> &[f64] {
        &self.last_lr
    }
    fn last_epoch(&self) -> i64 {
        self.last_epoch
    }
    fn state_dict(&self) -> Value {
        let children: Vec<Value> = self.schedulers.iter().map(|s| s.state_dict()).collect();
        let state = SequentialState {
            last_epoch: self.last_epoch,
            milestones: self.milestones.clone(),
            last_lr: self.last_lr.clone(),
            schedulers: Value::Array(children),
        };
        tagged(
            Self::NAME,
            serde_json::to_value(state).expect("state serializes"),
        )
    }
    fn load_state_dict(&mut self, state: &Value) -> Result<()> {
        let state: SequentialState = from_state(Self::NAME, untag(Self::NAME, state)?)?;
        let c = Check(Self::NAME);
        c.that(
            state.milestones.len() + 1 == self.schedulers.len(),
            "milestones.len()",
            state.milestones.len(),
            &format!(
                "must be {}, one fewer than the {} schedulers",
                self.schedulers.len() - 1,
                self.schedulers.len()
            ),
        )?;
        for (i, &m) in state.milestones.iter().enumerate() {
            c.count(&format!("milestones[{i}]"), m, 0)?;
        }
        c.that(
            state.milestones.windows(2).all(|w| w[0] < w[1]),
            "milestones",
            format!("{:?}", state.milestones),
            "must be strictly increasing switch epochs",
        )?;
        c.count("last_epoch", state.last_epoch, 0)?;
        check_last_lr(c, &state.last_lr, &self.schedulers)?;
        load_children(Self::NAME, &mut self.schedulers, &state.schedulers)?;
        self.last_epoch = state.last_epoch;
        self.milestones = state.milestones;
        self.last_lr = state.last_lr;
        Ok(())
    }
    fn initial_step(&mut self, opt: &mut dyn ParamGroupLr) -> Result<()> {
        self.step(opt)
    }
    fn jump_to_epoch(&mut self, _opt: &mut dyn ParamGroupLr, _epoch: i64) -> Result<()> {
        Err(SchedError::Unsupported {
            scheduler: Self::NAME,
            what: "a SequentialLR cannot follow a milestone inside another SequentialLR \
                   (PyTorch raises NotImplementedError too): flatten the schedulers into one \
                   SequentialLR"
                .into(),
        })
    }
    fn undo_last_epoch(&mut self) {
        for s in &mut self.schedulers {
            s.undo_last_epoch();
        }
    }
}

/// Step every scheduler each epoch, so their factors multiply (PyTorch `ChainedScheduler`).
/// If a child's step fails, the children before it have already stepped, as in PyTorch.
pub struct ChainedScheduler {
    schedulers: Vec<Box<dyn LrScheduler>>,
    last_lr: Vec<f64>,
}

impl std::fmt::Debug for ChainedScheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<_> = self.schedulers.iter().map(|s| s.name()).collect();
        f.debug_struct("ChainedScheduler")
            .field("schedulers", &names)
            .finish()
    }
}

impl ChainedScheduler {
    const NAME: &'static str = "ChainedScheduler";

    /// Chain `schedulers`, all built on `opt`.
    pub fn new(opt: &mut dyn ParamGroupLr, schedulers: Vec<Box<dyn LrScheduler>>) -> Result<Self> {
        check_not_empty(Self::NAME, schedulers.len())?;
        Ok(Self {
            schedulers,
            last_lr: group_lrs(opt),
        })
    }
}

impl LrScheduler for ChainedScheduler {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn step(&mut self, opt: &mut dyn ParamGroupLr) -> Result<()> {
        for s in &mut self.schedulers {
            s.step(opt)?;
        }
        self.last_lr = group_lrs(opt);
        Ok(())
    }
    fn get_last_lr(&self) -> &[f64] {
        &self.last_lr
    }
    fn last_epoch(&self) -> i64 {
        self.schedulers.last().map_or(0, |s| s.last_epoch())
    }
    fn state_dict(&self) -> Value {
        let children: Vec<Value> = self.schedulers.iter().map(|s| s.state_dict()).collect();
        tagged(
            Self::NAME,
            json!({ "last_lr": self.last_lr, "schedulers": children }),
        )
    }
    fn load_state_dict(&mut self, state: &Value) -> Result<()> {
        let state = untag(Self::NAME, state)?;
        let last_lr: Vec<f64> = from_state(Self::NAME, state["last_lr"].clone())?;
        check_last_lr(Check(Self::NAME), &last_lr, &self.schedulers)?;
        load_children(Self::NAME, &mut self.schedulers, &state["schedulers"])?;
        self.last_lr = last_lr;
        Ok(())
    }
    fn initial_step(&mut self, opt: &mut dyn ParamGroupLr) -> Result<()> {
        self.step(opt)
    }
    fn jump_to_epoch(&mut self, _opt: &mut dyn ParamGroupLr, _epoch: i64) -> Result<()> {
        Err(SchedError::Unsupported {
            scheduler: Self::NAME,
            what: "a ChainedScheduler cannot follow a milestone inside a SequentialLR (PyTorch \
                   raises NotImplementedError too): chain inside each phase instead"
                .into(),
        })
    }
    fn undo_last_epoch(&mut self) {
        for s in &mut self.schedulers {
            s.undo_last_epoch();
        }
    }
}
