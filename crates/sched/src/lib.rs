//! `kiln-sched`: learning-rate schedulers that reproduce PyTorch's sequences over an optimizer's
//! parameter groups, plus scalar logging (TensorBoard event files, CSV, SVG plots).
//!
//! # Schedulers
//!
//! A scheduler drives anything implementing [`ParamGroupLr`] (kiln's optimizers, or
//! [`LrGroups`] for plain lrs). It keeps its own state and takes the optimizer by `&mut` on each
//! call, exactly where PyTorch would read `optimizer.param_groups`:
//!
//! ```
//! use kiln_sched::{CosineAnnealingLR, LinearLR, LrGroups, LrScheduler, SequentialLR};
//!
//! let mut opt = LrGroups::new(&[0.1, 0.01]); // two parameter groups
//! let warmup = LinearLR::new(&mut opt, 0.1, 1.0, 5)?;
//! let decay = CosineAnnealingLR::new(&mut opt, 95, 0.0)?;
//! let mut sched = SequentialLR::new(&mut opt, vec![Box::new(warmup), Box::new(decay)], &[5])?;
//! for _epoch in 0..100 {
//!     // ... train one epoch, optimizer.step() ...
//!     sched.step(&mut opt)?;
//! }
//! assert_eq!(sched.get_last_lr().len(), 2);
//! # Ok::<(), kiln_sched::SchedError>(())
//! ```
//!
//! Every step-driven scheduler implements [`LrScheduler`]; ReduceLROnPlateau implements
//! [`MetricScheduler`], whose `step` takes the metric; [`LastLr`] reads the last lrs of either
//! kind. Mixing the two steps up does not compile:
//!
//! ```compile_fail,E0061
//! use kiln_sched::{LrGroups, LrScheduler, StepLR};
//! let mut opt = LrGroups::new(&[0.1]);
//! let mut s = StepLR::new(&mut opt, 10, 0.1).unwrap();
//! s.step(&mut opt, 0.5).unwrap(); // StepLR takes no metric
//! ```
//!
//! ```compile_fail,E0061
//! use kiln_sched::{LrGroups, MetricScheduler, PlateauOptions, ReduceLROnPlateau};
//! let mut opt = LrGroups::new(&[0.1]);
//! let mut s = ReduceLROnPlateau::new(&mut opt, PlateauOptions::default()).unwrap();
//! s.step(&mut opt).unwrap(); // ReduceLROnPlateau needs the metric
//! ```
//!
//! Sequences match PyTorch to 1e-12 relative over 1,000 steps (`tests/parity.rs` against
//! fixtures from `tests/fixtures/gen_sched.py`); `state_dict`/`load_state_dict` resume a run
//! identically. Unlike PyTorch there is no `last_epoch` constructor argument: resume with the
//! state dict.
//!
//! # Logging
//!
//! [`log::ScalarLogger`] records scalars (lr, loss, ...) to TensorBoard event files and/or CSV
//! and renders any logged series as an SVG plot ([`log::svg`]).

mod error;
mod last_lr;
pub mod log;
mod optim_impl;
mod param_group;
mod scheduler;
mod schedulers;
mod state_check;

pub use error::{Result, SchedError};
pub use last_lr::LastLr;
pub use param_group::{LrGroup, LrGroups, ParamGroupLr, PerGroup};
pub use scheduler::{LrScheduler, MetricScheduler};
pub use schedulers::basic::{
    ConstantLR, ExponentialLR, LinearLR, MultiStepLR, PolynomialLR, StepLR,
};
pub use schedulers::compose::{ChainedScheduler, SequentialLR};
pub use schedulers::cosine::{CosineAnnealingLR, CosineAnnealingWarmRestarts};
pub use schedulers::cyclic::{
    Anneal, CyclicLR, CyclicMode, CyclicOptions, OneCycleLR, OneCycleOptions,
};
pub use schedulers::lambda::{LambdaLR, LrLambda, MultiplicativeLR};
pub use schedulers::plateau::{PlateauMode, PlateauOptions, ReduceLROnPlateau, ThresholdMode};
