//! Kernels, one folder per op family, CPU and CUDA side by side.
//!
//! Each family's `mod.rs` declares its trait of the backend seam (`ConvOps`, `NormOps`, ...,
//! with `seam_trait!`, which also implements it for [`crate::Storage`]); `<family>/cpu.rs`
//! implements it for [`crate::CpuStorage`] over the typed slice kernels beside it,
//! `<family>/cuda.rs` for `CudaStorage`, launching `<family>/<family>.cu`. `buffer` is the base
//! family (dtype, device, length, host copies). The CPU implementations read operands and write
//! outputs through one dtype dispatch (`cpu_dispatch`) over the strided loops of `strided`.
//! Invariant: a family's `mod.rs` imports nothing from its own `cpu.rs`/`cuda.rs` (they import
//! the trait from it).

pub(crate) mod activation_math;
pub mod buffer;
pub mod conv;
pub mod copy;
pub(crate) mod cpu_dispatch;
pub mod elementwise;
pub(crate) mod exp_math;
pub mod fill;
pub(crate) mod gemm;
pub mod index;
mod kernel_error;
mod kernel_float;
pub mod loss;
pub mod matmul;
pub mod multi_tensor;
pub mod norm;
pub(crate) mod par;
pub mod pool;
pub mod random;
pub mod reduce;
pub(crate) mod simd;
pub mod softmax;
mod strided;
pub mod topk;

pub use cpu_dispatch::FLOAT_HINT;
pub use kernel_error::KernelError;
pub use kernel_float::KernelFloat;
pub use simd::cpu_capability;
