//! `kiln-optim`: optimizers (SGD, Adam, AdamW) with parameter groups, fused gradient clipping by
//! global norm and AMP loss scaling.
//!
//! A training step with clipping and mixed precision reads:
//!
//! ```text
//! scaler.scale(&loss)?.backward()?;
//! scaler.unscale_(&mut opt)?;                     // one fused pass: divide + inf check
//! clip_grad_norm_(&params, 1.0, 2.0, false)?;     // one read pass (+ a scale pass if clipping)
//! scaler.step(&mut opt)?;                         // one fused pass per group and dtype
//! scaler.update()?;
//! opt.zero_grad(true)?;
//! ```
//!
//! Everything that touches all gradients or all parameters runs on `kiln-device`'s
//! multi-tensor ops (`kiln_device::ops::multi_tensor`): fixed chunks over the whole list, one
//! parallel pass (one launch on CUDA), results identical for any thread count. This crate never
//! names a device: it checks what is optimizer semantics (dtypes, shared buffers, frozen
//! parameters), takes the buffer guards, and calls the device-agnostic functions, which
//! dispatch. See `clip`, `optimizer` and `scaler` for each piece.

/// A builder setter for a plain option field: `option_setter!(lr: f64, "Sets the learning rate.")`
/// expands to `pub fn lr(mut self, v: f64) -> Self`. Shared by the options of every optimizer.
macro_rules! option_setter {
    ($name:ident: $t:ty, $doc:literal) => {
        #[doc = $doc]
        pub fn $name(mut self, v: $t) -> Self {
            self.$name = v;
            self
        }
    };
}

mod adam;
pub mod clip;
mod error;
mod group;
mod operands;
mod optimizer;
mod scaler;
mod sgd;
mod state_dict;

pub use adam::{Adam, AdamAlgorithm, AdamOptions, AdamState, AdamW};
pub use clip::{
    clip_coef, clip_coef_for, clip_grad_norm_, clip_grad_norm_on_device, clip_grad_value_,
    clip_grads_with_norm_, get_total_norm, unnamed, ClipInfo,
};
pub(crate) use error::arg_err;
pub use error::{Error, Result};
pub use group::{IntoParamGroups, ParamEntry, ParamGroup};
pub use optimizer::{Algorithm, GroupOptions, GroupedOptimizer, Optimizer, StepItem};
pub use state_dict::{GroupRecord, ParamStateRecord, StateDict, TensorRecord};

/// The former name of [`GroupedOptimizer`], kept because kiln-sched implements its scheduler
/// trait for `Optim<A>`.
pub type Optim<A> = GroupedOptimizer<A>;
pub use scaler::{GradScaler, GradScalerOptions, GradScalerState};
pub use sgd::{Sgd, SgdAlgorithm, SgdOptions, SgdState};
