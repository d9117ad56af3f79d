//! Continuing a run: the state read from its checkpoint ([`super::checkpoint::resume`]) loaded
//! into the freshly built optimizer, schedule and loader, and the loss scaler restored. With
//! the model's weights, these and the seed are the whole state of a run, so a resumed run
//! continues bit for bit.

use super::checkpoint::{Progress, Resumed};
use super::config::TrainConfig;
use super::error::Result;
use kiln_autograd::DType;
use kiln_data::DataLoader;
use kiln_optim::{Adam, GradScaler, GradScalerState, Optimizer};
use kiln_sched::{LrScheduler, SequentialLR};

/// Loads `resumed` into the optimizer, the schedule and the training loader; returns the run's
/// progress and the saved loss-scaler state, if any.
pub(super) fn apply(
    resumed: Resumed,
    opt: &mut Adam,
    sched: &mut SequentialLR,
    train_loader: &mut DataLoader,
) -> Result<(Progress, Option<GradScalerState>)> {
    opt.load_state_dict(&resumed.optimizer)?;
    sched.load_state_dict(&resumed.scheduler)?;
    train_loader.set_state(resumed.loader)?;
    Ok((resumed.progress, resumed.grad_scaler))
}

/// The loss scaler of an f16 `amp` run, continuing from `resumed` when given; `None` otherwise.
/// f16 needs loss scaling (its range ends at 65504 and small gradients flush to zero); bf16
/// has f32's exponent range and needs none.
pub(super) fn grad_scaler(
    config: &TrainConfig,
    resumed: Option<&GradScalerState>,
) -> Result<Option<GradScaler>> {
    if !(config.amp && config.amp_dtype == DType::F16) {
        return Ok(None);
    }
    let mut scaler = GradScaler::new(config.grad_scaler)?;
    if let Some(state) = resumed {
        scaler.load_state_dict(state)?;
    }
    Ok(Some(scaler))
}
