//! The backend seam: the traits through which every tensor op reaches its kernel.
//!
//! `kiln-autograd` never touches a buffer directly. It validates shapes, builds [`Layout`]s
//! (views, broadcasts) and then calls a method of an op-family trait on a [`crate::Storage`],
//! which dispatches on the device to [`crate::CpuStorage`] or, behind the `cuda` feature, to
//! [`crate::CudaStorage`]. Each family is declared in `crate::ops::<family>` and implemented in
//! that folder's `cpu.rs` and `cuda.rs`, next to its kernels; [`BackendStorage`] is all of them
//! together. Adding a device means implementing every family; no op is written for one device
//! only.
//!
//! Kernels take any strided input layout and return a fresh contiguous buffer, except
//! [`CopyOps::copy_into`], which writes through a strided destination layout (used by `cat`,
//! `stack` and the backward of `narrow`/`select`), and [`NormOps::batch_norm_train`], which also
//! updates the running statistics in place. The neural-network methods take extra operands as
//! [`crate::Strided`] pairs and their validated geometry types from [`crate::ops`]; each forward
//! returns what its backward needs (max-pooling indices, batch/layer-norm statistics), and each
//! backward takes a [`crate::GradMask`] so only the gradients that are needed are computed. No
//! method falls back to another device silently.
//!
//! Method syntax needs the trait that declares a method in scope: `use
//! kiln_device::prelude::*` brings every family trait (and `BackendStorage`).

use crate::ops::buffer::BufferOps;
use crate::ops::conv::ConvOps;
use crate::ops::copy::CopyOps;
use crate::ops::elementwise::ElementwiseOps;
use crate::ops::fill::FillOps;
use crate::ops::index::IndexOps;
use crate::ops::loss::LossOps;
use crate::ops::matmul::MatmulOps;
use crate::ops::norm::NormOps;
use crate::ops::pool::PoolOps;
use crate::ops::random::RandomOps;
use crate::ops::reduce::ReduceOps;
use crate::ops::softmax::SoftmaxOps;
use crate::ops::topk::TopkOps;
#[cfg(doc)]
use crate::Layout;

/// Declares [`BackendStorage`] over the families listed once, with its blanket implementation.
macro_rules! backend_storage {
    ($(#[$attr:meta])* $first:ident $(+ $family:ident)*) => {
        $(#[$attr])*
        pub trait BackendStorage: $first $(+ $family)* {}

        impl<T: $first $(+ $family)*> BackendStorage for T {}
    };
}

backend_storage! {
    /// The kernels of one device over its buffer type: every op family at once.
    ///
    /// Implemented for every type that implements all the families (the CPU and CUDA storages
    /// and the [`crate::Storage`] enum dispatching between them); write bounds as
    /// `S: BackendStorage`.
    BufferOps
        + FillOps
        + RandomOps
        + CopyOps
        + ElementwiseOps
        + ReduceOps
        + MatmulOps
        + SoftmaxOps
        + ConvOps
        + PoolOps
        + NormOps
        + IndexOps
        + LossOps
        + TopkOps
}
