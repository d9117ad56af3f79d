//! `kiln-autograd`: tensors, views and reverse-mode automatic differentiation.
//!
//! [`Tensor`] is a strided view of a device buffer; every op validates its inputs, reaches its
//! kernel through the backend seam in `kiln-device` (`BackendStorage`), and, when grad mode is on
//! and an input requires grad, records a node whose backward closure owns what it saved.
//! [`Tensor::backward`] walks those nodes in reverse, freeing each node's saved tensors as it
//! runs. [`no_grad`] turns recording off per thread. [`Parameter`] and [`Module`] are the
//! contract layers and optimizers build on.

mod autocast;
mod autograd;
mod cpu_pool;
mod creation;
mod custom_op;
mod error;
mod hooks;
mod inplace;
mod join;
mod module;
mod ops;
mod random;
mod raw_access;
mod tensor;
pub mod testing;
mod view;

pub use autocast::{autocast, autocast_dtype, AutocastGuard};
pub use autograd::grad_mode::{
    enable_grad, is_grad_enabled, no_grad, EnableGradGuard, NoGradGuard,
};
pub use autograd::profile::{NodeTime, OpProfile, OpTimes};
pub use cpu_pool::on_cpu_pool;
pub use custom_op::CustomBackward;
pub use error::{Error, Result};
pub use hooks::{HookHandle, PostAccumulateGradHook};
pub use kiln_device::ops::conv::Conv2dParams;
pub use kiln_device::ops::pool::{AvgPool2dParams, MaxPool2dParams};
pub use kiln_device::{DType, Device};
pub use module::{Module, Parameter};
pub use ops::{broadcast_shapes, BatchNormOptions};
pub use random::{manual_seed, Generator};
pub use tensor::Tensor;
pub use view::MAX_EMPTY_CHUNKS;
