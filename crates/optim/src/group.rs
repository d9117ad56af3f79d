//! Parameter groups: each group is a list of named parameters plus the options it overrides;
//! every option it leaves unset comes from the optimizer's defaults (PyTorch's
//! `[{'params': ..., 'lr': ...}, ...]`).
//!
//! ```
//! # use kiln_autograd::{Device, DType, Parameter, Tensor};
//! # use kiln_optim::{AdamW, AdamOptions, Optimizer, ParamGroup};
//! # let p = |n: usize| Parameter::new(Tensor::zeros(&[n], DType::F32, Device::Cpu).unwrap()).unwrap();
//! # let backbone = vec![("conv.weight".to_string(), p(4))];
//! # let classifier = vec![("fc.weight".to_string(), p(2))];
//! // Fine-tuning: a small learning rate for the backbone, a large one for the new head, the same
//! // weight decay for both.
//! let opt = AdamW::new(
//!     vec![
//!         ParamGroup::new(backbone).lr(1e-5),
//!         ParamGroup::new(classifier).lr(1e-3),
//!     ],
//!     AdamOptions::adamw().weight_decay(1e-4),
//! )?;
//! assert_eq!(opt.lr(0)?, 1e-5);
//! assert_eq!(opt.options(1)?.weight_decay, 1e-4);
//! # Ok::<(), kiln_optim::Error>(())
//! ```
//!
//! Unnamed lists need no helper: a `Vec<Parameter>` (`module.parameters()`) converts into a
//! group (`.into()`), and the optimizers' constructors take one directly, as PyTorch's
//! `SGD(model.parameters(), lr=...)`; such parameters are named `param[i]` in errors and state.
//!
//! ```
//! # use kiln_autograd::{Device, DType, Parameter, Tensor};
//! # use kiln_optim::{Optimizer, ParamGroup, Sgd, SgdOptions};
//! # let p = |n: usize| Parameter::new(Tensor::zeros(&[n], DType::F32, Device::Cpu).unwrap()).unwrap();
//! let opt = Sgd::new(vec![p(3), p(2)], SgdOptions::default().lr(0.1))?;
//! let group: ParamGroup = vec![p(4)].into();
//! assert_eq!(group.params()[0].0, "param[0]");
//! # Ok::<(), kiln_optim::Error>(())
//! ```

use kiln_autograd::{Module, Parameter};

/// One entry of a parameter list, named or not: `(String, Parameter)` (what
/// `named_parameters` returns) or a bare [`Parameter`] (what `parameters` returns), named
/// `param[i]` by its place in the list. What the clip functions and [`ParamGroup`] take.
pub trait ParamEntry {
    /// The parameter.
    fn parameter(&self) -> &Parameter;
    /// Its name; `index` is its place in the list.
    fn name(&self, index: usize) -> String;
}

impl ParamEntry for (String, Parameter) {
    fn parameter(&self) -> &Parameter {
        &self.1
    }
    fn name(&self, _index: usize) -> String {
        self.0.clone()
    }
}

impl ParamEntry for Parameter {
    fn parameter(&self) -> &Parameter {
        self
    }
    fn name(&self, index: usize) -> String {
        format!("param[{index}]")
    }
}

/// Names every entry of `params` ([`ParamEntry::name`]).
pub(crate) fn named<P: ParamEntry>(params: &[P]) -> Vec<(String, Parameter)> {
    params
        .iter()
        .enumerate()
        .map(|(i, p)| (p.name(i), p.parameter().clone()))
        .collect()
}

/// What the optimizers' constructors take: a list of [`ParamGroup`]s, one group, or one plain
/// list of parameters (named or not), which becomes a single group with no overrides.
pub trait IntoParamGroups {
    /// The groups.
    fn into_param_groups(self) -> Vec<ParamGroup>;
}

impl IntoParamGroups for Vec<ParamGroup> {
    fn into_param_groups(self) -> Vec<ParamGroup> {
        self
    }
}

impl IntoParamGroups for ParamGroup {
    fn into_param_groups(self) -> Vec<ParamGroup> {
        vec![self]
    }
}

impl IntoParamGroups for Vec<Parameter> {
    fn into_param_groups(self) -> Vec<ParamGroup> {
        vec![self.into()]
    }
}

impl IntoParamGroups for Vec<(String, Parameter)> {
    fn into_param_groups(self) -> Vec<ParamGroup> {
        vec![ParamGroup::new(self)]
    }
}

impl From<Vec<Parameter>> for ParamGroup {
    fn from(params: Vec<Parameter>) -> Self {
        ParamGroup::new(named(&params))
    }
}

impl From<Vec<(String, Parameter)>> for ParamGroup {
    fn from(params: Vec<(String, Parameter)>) -> Self {
        ParamGroup::new(params)
    }
}

/// A list of named parameters and the options they override.
#[derive(Clone, Debug, Default)]
pub struct ParamGroup {
    pub(crate) params: Vec<(String, Parameter)>,
    pub(crate) lr: Option<f64>,
    pub(crate) momentum: Option<f64>,
    pub(crate) dampening: Option<f64>,
    pub(crate) weight_decay: Option<f64>,
    pub(crate) nesterov: Option<bool>,
    pub(crate) betas: Option<(f64, f64)>,
    pub(crate) eps: Option<f64>,
    pub(crate) amsgrad: Option<bool>,
    pub(crate) maximize: Option<bool>,
}

macro_rules! setter {
    ($name:ident: $t:ty, $doc:literal) => {
        #[doc = $doc]
        pub fn $name(mut self, value: $t) -> Self {
            self.$name = Some(value);
            self
        }
    };
}

impl ParamGroup {
    /// A group of `params` (e.g. `module.named_parameters()`) with no overrides.
    pub fn new(params: Vec<(String, Parameter)>) -> Self {
        ParamGroup {
            params,
            ..Default::default()
        }
    }

    /// A group of every parameter of `module`, named by their dotted paths.
    pub fn from_module(module: &dyn Module) -> Self {
        ParamGroup::new(module.named_parameters())
    }

    /// The group's parameters.
    pub fn params(&self) -> &[(String, Parameter)] {
        &self.params
    }

    setter!(lr: f64, "Overrides the learning rate.");
    setter!(momentum: f64, "Overrides SGD's momentum.");
    setter!(dampening: f64, "Overrides SGD's dampening.");
    setter!(weight_decay: f64, "Overrides the weight decay.");
    setter!(nesterov: bool, "Overrides SGD's Nesterov flag.");
    setter!(betas: (f64, f64), "Overrides Adam's betas.");
    setter!(eps: f64, "Overrides Adam's eps.");
    setter!(amsgrad: bool, "Overrides Adam's amsgrad flag.");
    setter!(maximize: bool, "Overrides the maximize flag (ascend instead of descend).");
}
