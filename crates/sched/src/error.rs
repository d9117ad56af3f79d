//! The one error type of kiln-sched: every message names what is wrong and how to fix it.

use std::path::PathBuf;

/// Everything that can go wrong building or stepping a scheduler, restoring its state, or
/// writing a log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SchedError {
    /// A constructor argument is out of range (PyTorch raises `ValueError` for most of these;
    /// kiln also rejects settings PyTorch silently accepts but computes nonsense from).
    #[error("{scheduler}: invalid `{parameter}` = {value}: {fix}")]
    InvalidParameter {
        /// The scheduler being built, e.g. `StepLR`.
        scheduler: &'static str,
        /// The argument's PyTorch name, e.g. `gamma`.
        parameter: &'static str,
        /// The rejected value, as text.
        value: String,
        /// What a valid value looks like.
        fix: String,
    },
    /// A per-group list has a different length than the optimizer has parameter groups.
    #[error(
        "{scheduler}: `{parameter}` has {got} values but the optimizer has {expected} parameter \
         groups: pass one value for all groups or exactly one per group"
    )]
    GroupCountMismatch {
        /// The scheduler being built.
        scheduler: &'static str,
        /// The per-group argument.
        parameter: &'static str,
        /// Number of parameter groups.
        expected: usize,
        /// Number of values given (or groups the scheduler was built for).
        got: usize,
    },
    /// The optimizer has no parameter groups.
    #[error("{scheduler}: the optimizer has no parameter groups: add at least one group first")]
    NoGroups {
        /// The scheduler being built.
        scheduler: &'static str,
    },
    /// `cycle_momentum` was requested but the optimizer has neither momentum nor beta1.
    #[error(
        "{scheduler}: `cycle_momentum` is on but the optimizer has no momentum or beta1 to cycle: \
         use an optimizer with momentum/betas or set `cycle_momentum: false`"
    )]
    NoMomentum {
        /// The scheduler being built.
        scheduler: &'static str,
    },
    /// OneCycleLR was stepped past its `total_steps`.
    #[error(
        "OneCycleLR: tried to step {step} times but `total_steps` is {total_steps}: build it with \
         a larger `total_steps` (epochs * steps_per_epoch) or stop stepping"
    )]
    StepsExhausted {
        /// The step that was attempted.
        step: i64,
        /// The configured total.
        total_steps: i64,
    },
    /// An optimizer group lacks the `initial_lr` that its scheduler set.
    #[error(
        "{scheduler}: parameter group {group} has no `initial_lr`: build the schedulers it \
         composes on the same optimizer before composing them"
    )]
    MissingInitialLr {
        /// The scheduler needing it.
        scheduler: &'static str,
        /// The group index.
        group: usize,
    },
    /// A state dict could not be restored.
    #[error("{scheduler}: cannot load state dict: {reason}: pass a dict saved by the same scheduler type and configuration")]
    State {
        /// The scheduler loading it.
        scheduler: &'static str,
        /// Why it failed.
        reason: String,
    },
    /// A loaded state dict holds a value out of range, non-finite, of the wrong length, or
    /// inconsistent with the scheduler it is loaded into; nothing was changed.
    #[error(
        "{scheduler}: cannot load state dict: `{field}` = {value}: {expected}; pass a dict saved \
         by the same scheduler type and configuration"
    )]
    InvalidState {
        /// The scheduler loading it.
        scheduler: &'static str,
        /// The state field, e.g. `step_size` or `core.base_lrs[1]`.
        field: String,
        /// The rejected value, as text.
        value: String,
        /// What a valid value looks like.
        expected: String,
    },
    /// The optimizer refused a value a scheduler wrote into a parameter group (kiln's
    /// optimizers take only lr >= 0, for instance); the step was undone.
    #[error("parameter group {group}: the optimizer refused {what} = {value:?}: {reason}")]
    Refused {
        /// The group index.
        group: usize,
        /// `lr`, `initial_lr` or `momentum`.
        what: &'static str,
        /// The refused value.
        value: f64,
        /// The optimizer's reason and the fix.
        reason: String,
    },
    /// A step computed a non-finite learning rate (a decay factor or lambda that overflows or
    /// is NaN); the step was undone. PyTorch would write it and train on garbage.
    #[error(
        "{scheduler}: the schedule computed lr = {value:?} for parameter group {group}: a factor \
         overflowed or is not a number; use a finite gamma / lambda / max_lr (the step was undone)"
    )]
    NonFiniteLr {
        /// The scheduler stepping.
        scheduler: &'static str,
        /// The group index.
        group: usize,
        /// The computed lr.
        value: f64,
    },
    /// An operation that PyTorch also does not support.
    #[error("{scheduler}: {what}")]
    Unsupported {
        /// The scheduler.
        scheduler: &'static str,
        /// What is unsupported and what to do instead.
        what: String,
    },
    /// Writing or reading a log file failed.
    #[error("log file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A log file (TensorBoard event file or CSV) is corrupt or not the expected format.
    #[error("log file {path}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong at which offset.
        reason: String,
    },
    /// A logged value or tag cannot be written.
    #[error("scalar logger: {reason}")]
    InvalidLog {
        /// What is wrong and how to fix it.
        reason: String,
    },
}

/// Shorthand for results of this crate.
pub type Result<T, E = SchedError> = std::result::Result<T, E>;

pub(crate) fn invalid(
    scheduler: &'static str,
    parameter: &'static str,
    value: impl std::fmt::Display,
    fix: impl Into<String>,
) -> SchedError {
    SchedError::InvalidParameter {
        scheduler,
        parameter,
        value: shown(value),
        fix: fix.into(),
    }
}

/// A rejected value as the error prints it: as `Display` writes it, except a float whose
/// `Display` runs long (every digit of 1e300, every leading zero of 1e-300), which is written
/// in its shortest form with an exponent (`1e300`; Python writes `1e+300`).
pub(crate) fn shown(value: impl std::fmt::Display) -> String {
    let text = value.to_string();
    match text.parse::<f64>() {
        Ok(v) if text.len() > 24 && v.is_finite() => format!("{v:?}"),
        _ => text,
    }
}

#[cfg(test)]
mod tests {
    use super::shown;

    #[test]
    fn long_floats_are_shown_with_an_exponent_and_everything_else_as_displayed() {
        assert_eq!(shown(1e300), "1e300");
        assert_eq!(shown(-1e-300), "-1e-300");
        assert_eq!(shown(f64::MAX), "1.7976931348623157e308");
        assert_eq!(shown(0.5), "0.5");
        assert_eq!(shown(2.0), "2");
        assert_eq!(shown(f64::NAN), "NaN");
        assert_eq!(shown(u64::MAX), "18446744073709551615");
        assert_eq!(shown(-7i64), "-7");
        assert_eq!(shown("[0.1, 0.2]"), "[0.1, 0.2]");
    }
}
