//! Kernels, one folder per op family, CPU and CUDA side by side (`<family>/cpu.rs`,
//! `<family>/cuda.rs`, `<family>/<family>.cu`).

pub mod conv;
pub mod copy;
pub mod elementwise;
pub mod fill;
pub mod index;
mod kernel_error;
mod kernel_float;
pub mod loss;
pub mod matmul;
pub mod norm;
pub mod pool;
pub mod random;
pub mod reduce;
pub mod softmax;

pub use kernel_error::KernelError;
pub use kernel_float::KernelFloat;
