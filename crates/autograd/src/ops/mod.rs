//! Differentiable ops on [`Tensor`](crate::Tensor), one file per family. Each op validates its
//! arguments (errors name the op, the shapes and the rule), calls one method of the backend seam
//! (`kiln_device::BackendStorage`) and records a backward closure that saves only what it needs.
//! Ops whose math is a composition (mean, var, logsumexp, triu) are written as compositions and get
//! their gradients from the parts.

mod binary;
mod conv_pool;
mod dropout;
mod index;
mod matmul;
mod norm;
mod reduce;
mod softmax;
mod topk;
mod unary;

pub use binary::broadcast_shapes;
pub use norm::BatchNormOptions;
