//! What the `distributed` group's threads cases and its MPI case ([`super::distributed_mpi`])
//! share: the benchmarked MLP, its optimizer and the median of a run's step times.

use super::harness::err;
use kiln_autograd::Module;
use kiln_models::layers::Sequential;
use kiln_models::models::mlp;
use kiln_optim::{Optimizer, ParamGroup, Sgd, SgdOptions};

/// The benchmarked MLP of layer widths `sizes`.
pub(super) fn model(sizes: &[usize]) -> Result<Sequential, String> {
    mlp(sizes, 0.0).map_err(err)
}

/// SGD at lr 1e-3 over every parameter of `model`.
pub(super) fn sgd(model: &dyn Module) -> Result<Box<dyn Optimizer>, String> {
    let groups = vec![ParamGroup::from_module(model)];
    Ok(Box::new(
        Sgd::new(groups, SgdOptions::default().lr(1e-3)).map_err(err)?,
    ))
}

/// The median of `v` (NaN when empty).
pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}
