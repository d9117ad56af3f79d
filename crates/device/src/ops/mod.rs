//! Kernels, one folder per op family, CPU and CUDA side by side (`<family>/cpu.rs`,
//! `<family>/cuda.rs`, `<family>/<family>.cu`).

pub mod conv;
pub mod index;
mod kernel_error;
mod kernel_float;
pub mod norm;
pub mod pool;

pub use kernel_error::KernelError;
pub use kernel_float::KernelFloat;
