//! User-function schedulers: LambdaLR (lr = base lr * f(epoch)) and MultiplicativeLR
//! (lr = current lr * f(epoch)).
//!
//! The functions are not part of the state dict (PyTorch stores `None` for plain functions
//! too): a resumed scheduler is built with the same functions, then loads its counters.

use std::sync::Arc;

use crate::error::{Result, SchedError};
use crate::param_group::ParamGroupLr;
use crate::scheduler::{
    core_accessors, from_state, group_lrs, impl_lr_scheduler, Chainable, Core, LrScheduler,
};
use crate::state_check::Check;

/// A learning-rate function of the epoch (`last_epoch`, 0 at construction).
pub type LrLambda = Arc<dyn Fn(i64) -> f64 + Send + Sync>;

fn per_group(
    scheduler: &'static str,
    opt: &dyn ParamGroupLr,
    lambdas: Vec<LrLambda>,
) -> Result<Vec<LrLambda>> {
    let n = opt.num_lr_groups();
    match lambdas.len() {
        1 => Ok(vec![lambdas[0].clone(); n]),
        len if len == n => Ok(lambdas),
        len => Err(SchedError::GroupCountMismatch {
            scheduler,
            parameter: "lr_lambda",
            expected: n,
            got: len,
        }),
    }
}

/// lr of group g = base lr of g * `lr_lambda[g](epoch)` (PyTorch `LambdaLR`).
pub struct LambdaLR {
    core: Core,
    lambdas: Vec<LrLambda>,
}

impl LambdaLR {
    /// One function for every group.
    pub fn new(
        opt: &mut dyn ParamGroupLr,
        lr_lambda: impl Fn(i64) -> f64 + Send + Sync + 'static,
    ) -> Result<Self> {
        Self::per_group(opt, vec![Arc::new(lr_lambda)])
    }

    /// One function per group (or a single one for all). Errors when the count matches
    /// neither 1 nor the number of groups.
    pub fn per_group(opt: &mut dyn ParamGroupLr, lr_lambdas: Vec<LrLambda>) -> Result<Self> {
        let lambdas = per_group(Self::NAME, opt, lr_lambdas)?;
        let mut s = Self {
            core: Core::attach(Self::NAME, opt)?,
            lambdas,
        };
        s.initial_step(opt)?;
        Ok(s)
    }
}

impl std::fmt::Debug for LambdaLR {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LambdaLR")
            .field("core", &self.core)
            .finish_non_exhaustive()
    }
}

impl Chainable for LambdaLR {
    const NAME: &'static str = "LambdaLR";
    core_accessors!();
    fn get_lr(&mut self, _opt: &mut dyn ParamGroupLr) -> Result<Vec<f64>> {
        let e = self.core.last_epoch;
        Ok(self
            .core
            .base_lrs
            .iter()
            .zip(&self.lambdas)
            .map(|(b, f)| b * f(e))
            .collect())
    }
    fn save(&self) -> serde_json::Value {
        serde_json::to_value(&self.core).expect("core serializes")
    }
    fn restore(&mut self, state: serde_json::Value) -> Result<()> {
        let core: Core = from_state(Self::NAME, state)?;
        Check(Self::NAME).core(&core, &self.core)?;
        self.core = core;
        Ok(())
    }
}
impl_lr_scheduler!(LambdaLR);

/// lr of group g = current lr of g * `lr_lambda[g](epoch)` each epoch after the first
/// (PyTorch `MultiplicativeLR`).
pub struct MultiplicativeLR {
    core: Core,
    lambdas: Vec<LrLambda>,
}

impl MultiplicativeLR {
    /// One factor function for every group.
    pub fn new(
        opt: &mut dyn ParamGroupLr,
        lr_lambda: impl Fn(i64) -> f64 + Send + Sync + 'static,
    ) -> Result<Self> {
        Self::per_group(opt, vec![Arc::new(lr_lambda)])
    }

    /// One factor function per group (or a single one for all).
    pub fn per_group(opt: &mut dyn ParamGroupLr, lr_lambdas: Vec<LrLambda>) -> Result<Self> {
        let lambdas = per_group(Self::NAME, opt, lr_lambdas)?;
        let mut s = Self {
            core: Core::attach(Self::NAME, opt)?,
            lambdas,
        };
        s.initial_step(opt)?;
        Ok(s)
    }
}

impl std::fmt::Debug for MultiplicativeLR {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiplicativeLR")
            .field("core", &self.core)
            .finish_non_exhaustive()
    }
}

impl Chainable for MultiplicativeLR {
    const NAME: &'static str = "MultiplicativeLR";
    core_accessors!();
    fn get_lr(&mut self, opt: &mut dyn ParamGroupLr) -> Result<Vec<f64>> {
        let lrs = group_lrs(opt);
        if self.core.initial {
            return Ok(lrs);
        }
        let e = self.core.last_epoch;
        Ok(lrs
            .iter()
            .zip(&self.lambdas)
            .map(|(lr, f)| lr * f(e))
            .collect())
    }
    fn save(&self) -> serde_json::Value {
        serde_json::to_value(&self.core).expect("core serializes")
    }
    fn restore(&mut self, state: serde_json::Value) -> Result<()> {
        let core: Core = from_state(Self::NAME, state)?;
        Check(Self::NAME).core(&core, &self.core)?;
        self.core = core;
        Ok(())
    }
}
impl_lr_scheduler!(MultiplicativeLR);
