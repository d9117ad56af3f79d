//! The [`Optimizer`] trait and [`GroupedOptimizer`], the machinery every optimizer shares:
//! parameter groups with inherited options, duplicate and empty-group checks, lazily created
//! per-parameter state (frozen parameters never get any), `zero_grad`, and state dicts.
//!
//! An optimizer algorithm ([`Algorithm`]) only supplies its options type, its per-parameter
//! state and one fused update over the parameters of a group that have a gradient this step:
//! one multi-tensor pass over all of them (PyTorch's `foreach`/`fused` paths).
//!
//! Invariants: a parameter belongs to exactly one group; state exists only for parameters
//! stepped at least once (here or in a loaded state dict); updates run under `no_grad`.

use crate::group::ParamGroup;
use crate::operands::checked_grad;
use crate::state_dict::{GroupRecord, ParamStateRecord, StateDict};
use crate::{Error, Result};
use kiln_autograd::{Parameter, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};

/// The largest step count a loaded state may hold (f64 counts exactly up to it).
const MAX_LOADED_STEP: u64 = 1 << 53;

/// What every optimizer offers: a step, gradient clearing, per-group hyper-parameters (the
/// accessors learning-rate schedulers drive) and state dicts.
pub trait Optimizer {
    /// One update of every parameter that has a gradient.
    fn step(&mut self) -> Result<()> {
        self.step_with_grad_scale(1.0)
    }
    /// One update reading every gradient multiplied by `grad_scale` (a clip coefficient from
    /// [`crate::clip_coef_for`], or an unscale factor) without writing the gradients: saves the
    /// separate read-and-write pass over all gradients. `grad_scale = 1` is exactly [`step`].
    ///
    /// [`step`]: Optimizer::step
    fn step_with_grad_scale(&mut self, grad_scale: f64) -> Result<()>;
    /// Clears every gradient: dropped when `set_to_none` (PyTorch's default), else zeroed.
    fn zero_grad(&mut self, set_to_none: bool) -> Result<()>;
    /// Adds a group after creation (e.g. when unfreezing layers mid-training).
    fn add_param_group(&mut self, group: ParamGroup) -> Result<()>;
    /// Every parameter, with its name, group by group.
    fn named_params(&self) -> Vec<(String, Parameter)>;
    /// Number of parameter groups.
    fn num_groups(&self) -> usize;
    /// Learning rate of group `group`.
    fn lr(&self, group: usize) -> Result<f64>;
    /// Sets the learning rate of group `group`.
    fn set_lr(&mut self, group: usize, lr: f64) -> Result<()>;
    /// SGD's momentum or Adam's beta1 of group `group` (what one-cycle schedules cycle).
    fn momentum(&self, group: usize) -> Result<Option<f64>>;
    /// Sets SGD's momentum or Adam's beta1; an error for an optimizer without one.
    fn set_momentum(&mut self, group: usize, momentum: f64) -> Result<()>;
    /// Adam's `(beta1, beta2)` of group `group`, `None` for SGD.
    fn betas(&self, group: usize) -> Result<Option<(f64, f64)>>;
    /// Sets Adam's betas; an error for SGD.
    fn set_betas(&mut self, group: usize, betas: (f64, f64)) -> Result<()>;
    /// The lr group `group` had when the first learning-rate scheduler attached (PyTorch's
    /// `param_groups[g]["initial_lr"]`); `None` until a scheduler records it.
    fn initial_lr(&self, group: usize) -> Result<Option<f64>>;
    /// Records `initial_lr` for group `group` (schedulers do this when they attach).
    fn set_initial_lr(&mut self, group: usize, lr: f64) -> Result<()>;
    /// The optimizer's state: group options, step counts and moment buffers.
    fn state_dict(&self) -> Result<StateDict>;
    /// Restores a state saved by [`Optimizer::state_dict`] of an optimizer of the same kind over
    /// the same parameter layout; training then continues bit-identically.
    fn load_state_dict(&mut self, state: &StateDict) -> Result<()>;
}

/// The options of one group of an optimizer (`SgdOptions`, `AdamOptions`).
pub trait GroupOptions: Clone + std::fmt::Debug + Serialize + for<'de> Deserialize<'de> {
    /// The defaults overridden by what `group` sets; an error for an option this optimizer has
    /// not got, or a value out of range.
    fn resolve(&self, group: &ParamGroup) -> Result<Self>;
    /// Checks ranges (PyTorch's constructor checks).
    fn validate(&self) -> Result<()>;
    /// The learning rate.
    fn lr(&self) -> f64;
    /// Sets the learning rate.
    fn set_lr(&mut self, lr: f64);
    /// Momentum or beta1, when the optimizer has one.
    fn momentum(&self) -> Option<f64>;
    /// Sets momentum or beta1; `false` when there is none.
    fn set_momentum(&mut self, m: f64) -> bool;
    /// Adam's betas.
    fn betas(&self) -> Option<(f64, f64)>;
    /// Sets Adam's betas; `false` when there are none.
    fn set_betas(&mut self, b: (f64, f64)) -> bool;
}

/// One parameter to update this step.
pub struct StepItem<'a, S> {
    /// Its name (for messages).
    pub name: &'a str,
    /// The parameter.
    pub param: &'a Parameter,
    /// Its gradient, already checked for the fused pass (the parameter's dtype, its own
    /// buffer, dense): every gradient of the group passes before any state changes.
    pub grad: Tensor,
    /// Its state, created at its first step.
    pub state: &'a mut S,
}

/// An optimizer algorithm: options, per-parameter state and the fused group update.
pub trait Algorithm {
    /// Per-group options.
    type Options: GroupOptions;
    /// Per-parameter state.
    type State;
    /// Name recorded in state dicts (`"SGD"`, `"Adam"`, `"AdamW"`).
    fn name(&self) -> &'static str;
    /// The op a refused gradient's message names; [`Algorithm::name`] unless overridden.
    fn step_op(&self) -> &'static str {
        self.name()
    }
    /// Fresh state for `param` at its first step.
    fn init_state(&self, options: &Self::Options, param: &Parameter) -> Result<Self::State>;
    /// Updates every item in one fused pass, gradients read times `grad_scale`.
    fn step_group(
        &self,
        options: &Self::Options,
        items: Vec<StepItem<'_, Self::State>>,
        grad_scale: f64,
    ) -> Result<()>;
    /// The state as a record.
    fn save_state(&self, state: &Self::State) -> Result<ParamStateRecord>;
    /// State from a record, for `param`.
    fn load_state(&self, record: &ParamStateRecord, param: &Parameter) -> Result<Self::State>;
}

struct Group<O, S> {
    params: Vec<(String, Parameter)>,
    options: O,
    /// PyTorch's `initial_lr` key: written once by the first scheduler attached.
    initial_lr: Option<f64>,
    /// Per-parameter state, by position in `params`; `None` until the parameter's first step.
    state: Vec<Option<S>>,
}

/// An optimizer over parameter groups: groups of parameters with options, per-parameter state,
/// and the [`Algorithm`] that updates them (SGD, Adam and AdamW are `GroupedOptimizer`s).
///
/// State lives next to its parameter (by position), so a step walks each group once and looks
/// nothing up: the per-parameter cost of a step over thousands of small tensors is a gradient
/// read and the fused pass's own bookkeeping.
pub struct GroupedOptimizer<A: Algorithm> {
    algorithm: A,
    defaults: A::Options,
    groups: Vec<Group<A::Options, A::State>>,
    /// Where each parameter (by id) sits: `(group, position)`.
    index: HashMap<u64, (usize, usize)>,
}

impl<A: Algorithm> GroupedOptimizer<A> {
    pub(crate) fn with_algorithm(
        algorithm: A,
        groups: Vec<ParamGroup>,
        defaults: A::Options,
    ) -> Result<Self> {
        defaults.validate()?;
        if groups.is_empty() {
            return Err(Error::ParamGroup(format!(
                "{}: no parameter groups given; pass at least one ParamGroup",
                algorithm.name()
            )));
        }
        let mut opt = GroupedOptimizer {
            algorithm,
            defaults,
            groups: Vec::new(),
            index: HashMap::new(),
        };
        for g in groups {
            opt.push_group(g)?;
        }
        Ok(opt)
    }

    fn push_group(&mut self, group: ParamGroup) -> Result<()> {
        let name = self.algorithm.name();
        let index = self.groups.len();
        if group.params.is_empty() {
            return Err(Error::ParamGroup(format!(
                "{name}: parameter group {index} is empty; give every group at least one parameter"
            )));
        }
        let options = self.defaults.resolve(&group)?;
        let mut here = HashSet::new();
        let mut keys = HashSet::new();
        for (n, p) in &group.params {
            if let Some(&(g, i)) = self.index.get(&p.id()) {
                let prev = &self.groups[g].params[i].0;
                return Err(Error::ParamGroup(format!(
                    "{name}: parameter `{n}` appears in more than one parameter group (first as \
                     `{prev}`); list each parameter in exactly one group"
                )));
            }
            if !here.insert(p.id()) {
                return Err(Error::ParamGroup(format!(
                    "{name}: parameter `{n}` is listed twice in parameter group {index}; list it once"
                )));
            }
            keys.insert(p.storage_key());
        }
        for g in &self.groups {
            for (n, p) in &g.params {
                if keys.contains(&p.storage_key()) {
                    return Err(Error::ParamGroup(format!(
                        "{name}: parameter `{n}` shares its buffer with a parameter of group \
                         {index}; pass the shared parameter once"
                    )));
                }
            }
        }
        if keys.len() != group.params.len() {
            return Err(Error::ParamGroup(format!(
                "{name}: two parameters of group {index} share one buffer (views of one tensor); \
                 pass the underlying parameter once"
            )));
        }
        for (i, (_, p)) in group.params.iter().enumerate() {
            self.index.insert(p.id(), (index, i));
        }
        self.groups.push(Group {
            state: std::iter::repeat_with(|| None)
                .take(group.params.len())
                .collect(),
            params: group.params,
            options,
            initial_lr: None,
        });
        Ok(())
    }

    fn group(&self, g: usize) -> Result<&Group<A::Options, A::State>> {
        let n = self.groups.len();
        self.groups.get(g).ok_or_else(|| {
            crate::arg_err(
                "param group",
                format!("group {g} does not exist; this optimizer has {n} group(s)"),
            )
        })
    }

    fn group_mut(&mut self, g: usize) -> Result<&mut Group<A::Options, A::State>> {
        self.group(g)?;
        Ok(&mut self.groups[g])
    }

    /// The resolved options of group `group`.
    pub fn options(&self, group: usize) -> Result<&A::Options> {
        Ok(&self.group(group)?.options)
    }

    /// Replaces the options of group `group` (validated).
    pub fn set_options(&mut self, group: usize, options: A::Options) -> Result<()> {
        options.validate()?;
        self.group_mut(group)?.options = options;
        Ok(())
    }

    /// True when `param` has optimizer state (it has been stepped at least once).
    pub fn has_state(&self, param: &Parameter) -> bool {
        self.state_of(param).is_some()
    }

    /// The state of `param`, if it has been stepped.
    pub fn state_of(&self, param: &Parameter) -> Option<&A::State> {
        let &(g, i) = self.index.get(&param.id())?;
        self.groups[g].state[i].as_ref()
    }
}

impl<A: Algorithm> Optimizer for GroupedOptimizer<A> {
    fn step_with_grad_scale(&mut self, grad_scale: f64) -> Result<()> {
        kiln_autograd::no_grad(|| {
            for g in &mut self.groups {
                // Frozen parameters and parameters without a gradient are skipped and get no
                // state (PyTorch's `if p.grad is not None`).
                let grads: Vec<(usize, Tensor)> = g
                    .params
                    .iter()
                    .enumerate()
                    .filter(|(_, (_, p))| p.requires_grad())
                    .filter_map(|(i, (_, p))| p.grad().map(|gr| (i, gr)))
                    .collect();
                if grads.is_empty() {
                    continue;
                }
                refuse_grads_viewing_params(&g.params, &grads)?;
                // Every gradient is checked before any state is created or changed, so a
                // refused step leaves the optimizer as it was (step counts included).
                let op = self.algorithm.step_op();
                let grads = grads
                    .into_iter()
                    .map(|(i, gr)| {
                        let (name, param) = &g.params[i];
                        checked_grad(op, name, param, gr).map(|gr| (i, gr))
                    })
                    .collect::<Result<Vec<_>>>()?;
                let mut items = Vec::with_capacity(grads.len());
                let mut grads = grads.into_iter().peekable();
                let entries = g.params.iter().zip(g.state.iter_mut()).enumerate();
                for (i, ((name, param), state)) in entries {
                    let Some((_, grad)) = grads.next_if(|(j, _)| *j == i) else {
                        continue;
                    };
                    let state = match state {
                        Some(s) => s,
                        None => {
                            let _state = optimizer_state();
                            state.insert(self.algorithm.init_state(&g.options, param)?)
                        }
                    };
                    items.push(StepItem {
                        name,
                        param,
                        grad,
                        state,
                    });
                }
                self.algorithm.step_group(&g.options, items, grad_scale)?;
            }
            Ok(())
        })
    }

    fn zero_grad(&mut self, set_to_none: bool) -> Result<()> {
        for g in &self.groups {
            for (_, p) in &g.params {
                if set_to_none {
                    p.set_grad(None)?;
                } else if let Some(gr) = p.grad() {
                    kiln_autograd::no_grad(|| gr.zero_())?;
                }
            }
        }
        Ok(())
    }

    fn add_param_group(&mut self, group: ParamGroup) -> Result<()> {
        self.push_group(group)
    }

    fn named_params(&self) -> Vec<(String, Parameter)> {
        self.groups
            .iter()
            .flat_map(|g| g.params.iter().cloned())
            .collect()
    }

    fn num_groups(&self) -> usize {
        self.groups.len()
    }

    fn lr(&self, group: usize) -> Result<f64> {
        Ok(self.group(group)?.options.lr())
    }

    fn set_lr(&mut self, group: usize, lr: f64) -> Result<()> {
        // Any finite lr, as PyTorch's `param_groups[g]["lr"]` takes: a schedule may end just
        // below 0 (OneCycleLR's linear anneal at its total_steps-th step); only the
        // constructor asks for lr >= 0, as PyTorch's does.
        if !lr.is_finite() {
            return Err(crate::arg_err(
                "set_lr",
                format!("invalid learning rate {lr:?}; pass a finite lr"),
            ));
        }
        self.group_mut(group)?.options.set_lr(lr);
        Ok(())
    }

    fn momentum(&self, group: usize) -> Result<Option<f64>> {
        Ok(self.group(group)?.options.momentum())
    }

    fn set_momentum(&mut self, group: usize, momentum: f64) -> Result<()> {
        let name = self.algorithm.name();
        let g = self.group_mut(group)?;
        let mut o = g.options.clone();
        if !o.set_momentum(momentum) {
            return Err(crate::arg_err(
                "set_momentum",
                format!("{name} has no momentum"),
            ));
        }
        o.validate()?;
        g.options = o;
        Ok(())
    }

    fn betas(&self, group: usize) -> Result<Option<(f64, f64)>> {
        Ok(self.group(group)?.options.betas())
    }

    fn set_betas(&mut self, group: usize, betas: (f64, f64)) -> Result<()> {
        let name = self.algorithm.name();
        let g = self.group_mut(group)?;
        let mut o = g.options.clone();
        if !o.set_betas(betas) {
            return Err(crate::arg_err("set_betas", format!("{name} has no betas")));
        }
        o.validate()?;
        g.options = o;
        Ok(())
    }

    fn initial_lr(&self, group: usize) -> Result<Option<f64>> {
        Ok(self.group(group)?.initial_lr)
    }

    fn set_initial_lr(&mut self, group: usize, lr: f64) -> Result<()> {
        if lr.is_nan() || lr < 0.0 {
            return Err(crate::arg_err(
                "set_initial_lr",
                format!("invalid learning rate {lr:?}; pass lr >= 0"),
            ));
        }
        self.group_mut(group)?.initial_lr = Some(lr);
        Ok(())
    }

    fn state_dict(&self) -> Result<StateDict> {
        let mut groups = Vec::new();
        let mut state = Vec::new();
        for g in &self.groups {
            groups.push(GroupRecord {
                params: g.params.iter().map(|(n, _)| n.clone()).collect(),
                options: serde_json::to_value(&g.options)
                    .map_err(|e| Error::StateDict(format!("options do not serialise: {e}")))?,
                initial_lr: g.initial_lr,
            });
            for s in &g.state {
                state.push(match s {
                    Some(s) => Some(self.algorithm.save_state(s)?),
                    None => None,
                });
            }
        }
        Ok(StateDict {
            optimizer: self.algorithm.name().to_string(),
            groups,
            state,
        })
    }

    fn load_state_dict(&mut self, sd: &StateDict) -> Result<()> {
        let name = self.algorithm.name();
        if sd.optimizer != name {
            return Err(Error::StateDict(format!(
                "the state dict is from {} but this optimizer is {name}",
                sd.optimizer
            )));
        }
        let sizes: Vec<usize> = self.groups.iter().map(|g| g.params.len()).collect();
        let saved: Vec<usize> = sd.groups.iter().map(|g| g.params.len()).collect();
        if sizes != saved || sd.state.len() != sizes.iter().sum::<usize>() {
            return Err(Error::StateDict(format!(
                "saved groups hold {saved:?} parameters but this optimizer's hold {sizes:?}; \
                 build the optimizer with the same parameter groups before loading"
            )));
        }
        let mut options = Vec::new();
        for (i, g) in sd.groups.iter().enumerate() {
            let o: A::Options = serde_json::from_value(g.options.clone()).map_err(|e| {
                Error::StateDict(format!("group {i}: options do not match {name}'s: {e}"))
            })?;
            // The lr was written by set_lr, which takes any finite value (see there).
            let mut ranges = o.clone();
            ranges.set_lr(o.lr().abs());
            ranges.validate()?;
            if !o.lr().is_finite() {
                return Err(Error::StateDict(format!(
                    "group {i}: lr {} is not finite; the state is damaged",
                    o.lr()
                )));
            }
            options.push(o);
        }
        let mut records = sd.state.iter();
        let mut state = Vec::with_capacity(self.groups.len());
        for g in &self.groups {
            let mut loaded = Vec::with_capacity(g.params.len());
            for ((n, p), rec) in g.params.iter().zip(records.by_ref()) {
                loaded.push(match rec {
                    // Every algorithm counts its steps in a `u64` it adds one to per step.
                    Some(rec) if rec.step > MAX_LOADED_STEP => {
                        return Err(Error::StateDict(format!(
                            "parameter `{n}`: step count {} is past 2^53, more steps than any \
                             run takes (a count that could overflow at the next step); the \
                             state dict is corrupt, load an intact one",
                            rec.step
                        )));
                    }
                    Some(rec) => {
                        let _state = optimizer_state();
                        Some(self.algorithm.load_state(rec, p).map_err(|e| match e {
                            Error::StateDict(msg) => {
                                Error::StateDict(format!("parameter `{n}`: {msg}"))
                            }
                            other => other,
                        })?)
                    }
                    None => None,
                });
            }
            state.push(loaded);
        }
        let groups = self.groups.iter_mut().zip(options).zip(&sd.groups);
        for (((g, o), rec), s) in groups.zip(state) {
            g.options = o;
            g.initial_lr = rec.initial_lr;
            g.state = s;
        }
        Ok(())
    }
}

/// Refuses a gradient that views a parameter's buffer (any parameter of the group): the fused
/// pass holds every parameter's buffer for writing while it reads the gradients. The buffer
/// keys are sorted once, so the check costs a binary search per gradient.
fn refuse_grads_viewing_params(
    params: &[(String, Parameter)],
    grads: &[(usize, Tensor)],
) -> Result<()> {
    let mut keys: Vec<usize> = params.iter().map(|(_, p)| p.storage_key()).collect();
    keys.sort_unstable();
    match grads
        .iter()
        .find(|(_, gr)| keys.binary_search(&gr.storage_key()).is_ok())
    {
        Some((i, _)) => Err(Error::Unsupported {
            op: "step",
            msg: format!(
                "the gradient of `{}` views a parameter's buffer; give each gradient its own \
                 buffer (e.g. set_grad with a copy)",
                params[*i].0
            ),
        }),
        None => Ok(()),
    }
}

/// Declares that what is allocated until the guard drops is optimizer state (the allocation
/// history's category; the step's temporaries stay `Temporary`).
pub(crate) fn optimizer_state() -> kiln_device::ContextGuard {
    kiln_device::AllocContext::category(kiln_device::MemoryCategory::OptimizerState)
}
