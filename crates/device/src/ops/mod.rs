//! Kernels, one folder per op family, CPU and CUDA side by side (`<family>/cpu.rs`,
//! `<family>/cuda.rs`, `<family>/<family>.cu`).

pub mod copy;
pub mod elementwise;
pub mod fill;
pub mod matmul;
pub mod random;
pub mod reduce;
pub mod softmax;
