//! [`Reduction`]: how per-element losses become the returned tensor (PyTorch's `reduction`).

use crate::Result;
use kiln_autograd::Tensor;

/// PyTorch's `reduction` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reduction {
    /// Per-element losses (`'none'`).
    None,
    /// Their mean (`'mean'`, the default); weighted losses divide by the weight sum where
    /// PyTorch does (`cross_entropy`/`nll_loss` with class weights).
    #[default]
    Mean,
    /// Their sum (`'sum'`).
    Sum,
}

impl Reduction {
    /// Applies the plain (unweighted) reduction.
    pub(crate) fn apply(self, losses: Tensor) -> Result<Tensor> {
        Ok(match self {
            Reduction::None => losses,
            Reduction::Mean => losses.mean_all()?,
            Reduction::Sum => losses.sum_all()?,
        })
    }
}
