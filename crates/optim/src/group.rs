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

use kiln_autograd::{Module, Parameter};

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
