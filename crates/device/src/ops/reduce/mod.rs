//! Reductions over a set of dims (sum, max, min, argmax, argmin). Mean, var/std, logsumexp and
//! norm are composed from these in `kiln-autograd`, so a backend implements only this small set.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
pub mod plan;
