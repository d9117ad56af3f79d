//! [`LastLr`]: one trait that reads the lrs a scheduler last wrote, whatever kind it is. The
//! step-driven [`LrScheduler`] and the metric-driven [`MetricScheduler`] stay two traits (so a
//! metric cannot be passed to a scheduler that takes none, and none to one that needs it), but
//! code that only reports lrs (a logger, a progress line) takes `&dyn LastLr` or `S: LastLr` and
//! accepts both kinds.
//!
//! Invariant: for every scheduler, `last_lr()` is exactly its kind's `get_last_lr()` (one lr per
//! parameter group, PyTorch's `get_last_lr()`); each impl below forwards to it.

use crate::scheduler::{LrScheduler, MetricScheduler};
use crate::{
    ChainedScheduler, ConstantLR, CosineAnnealingLR, CosineAnnealingWarmRestarts, CyclicLR,
    ExponentialLR, LambdaLR, LinearLR, MultiStepLR, MultiplicativeLR, OneCycleLR, PolynomialLR,
    ReduceLROnPlateau, SequentialLR, StepLR,
};

/// The lrs a scheduler last wrote, one per parameter group (PyTorch's `get_last_lr()`), for
/// every scheduler kind: step-driven ([`LrScheduler`]) and metric-driven
/// ([`MetricScheduler`], i.e. [`ReduceLROnPlateau`]).
///
/// ```
/// use kiln_sched::{LastLr, LrGroups, LrScheduler, MetricScheduler, PlateauOptions,
///     ReduceLROnPlateau, StepLR};
///
/// let (mut a, mut b) = (LrGroups::new(&[0.1]), LrGroups::new(&[0.1]));
/// let mut step = StepLR::new(&mut a, 1, 0.5)?;
/// let mut plateau = ReduceLROnPlateau::new(&mut b, PlateauOptions::default())?;
/// step.step(&mut a)?;
/// plateau.step(&mut b, 1.0)?;
/// let all: [&dyn LastLr; 2] = [&step, &plateau];
/// assert_eq!(all.map(|s| s.last_lr()[0]), [0.05, 0.1]);
/// # Ok::<(), kiln_sched::SchedError>(())
/// ```
pub trait LastLr {
    /// The lrs the scheduler last wrote, one per parameter group.
    fn last_lr(&self) -> &[f64];
}

/// One impl per step-driven scheduler, each forwarding to [`LrScheduler::get_last_lr`].
macro_rules! step_driven {
    ($($ty:ty),* $(,)?) => {
        $(
            impl LastLr for $ty {
                fn last_lr(&self) -> &[f64] {
                    LrScheduler::get_last_lr(self)
                }
            }
        )*
    };
}

step_driven!(
    StepLR,
    MultiStepLR,
    ExponentialLR,
    ConstantLR,
    LinearLR,
    PolynomialLR,
    CosineAnnealingLR,
    CosineAnnealingWarmRestarts,
    CyclicLR,
    OneCycleLR,
    LambdaLR,
    MultiplicativeLR,
    SequentialLR,
    ChainedScheduler,
);

impl LastLr for ReduceLROnPlateau {
    fn last_lr(&self) -> &[f64] {
        MetricScheduler::get_last_lr(self)
    }
}

impl LastLr for dyn LrScheduler {
    fn last_lr(&self) -> &[f64] {
        self.get_last_lr()
    }
}

impl LastLr for dyn MetricScheduler {
    fn last_lr(&self) -> &[f64] {
        self.get_last_lr()
    }
}

impl<T: LastLr + ?Sized> LastLr for Box<T> {
    fn last_lr(&self) -> &[f64] {
        (**self).last_lr()
    }
}

impl<T: LastLr + ?Sized> LastLr for &T {
    fn last_lr(&self) -> &[f64] {
        (**self).last_lr()
    }
}
