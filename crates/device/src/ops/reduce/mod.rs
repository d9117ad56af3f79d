//! Reductions over a set of dims (sum, max, min, argmax, argmin). Mean, var/std, logsumexp and
//! norm are composed from these in `kiln-autograd`, so a backend implements only this small set.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
pub mod plan;

use crate::ops::buffer::BufferOps;
use crate::seam::{pass_through, seam_trait};
use crate::{Layout, Result};

/// Reductions over a set of dims.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// sum (floats accumulate in f64, integers in i64; bool sums to i64)
    Sum,
    /// maximum (NaN-propagating)
    Max,
    /// minimum (NaN-propagating)
    Min,
    /// index of the first maximum along exactly one dim, as `I64`
    ArgMax,
    /// index of the first minimum along exactly one dim, as `I64`
    ArgMin,
}

pass_through!(ReduceOp);

seam_trait! {
    /// Reductions.
    pub trait ReduceOps: BufferOps {
        /// Reduces `dims` (sorted, unique); the output is contiguous with those dims of size 1.
        fn reduce(&self, layout: &Layout, dims: &[usize], op: ReduceOp) -> Result<Self>;
    }
}
