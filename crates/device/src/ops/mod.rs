//! Kernels, one folder per op family, CPU and CUDA side by side (`<family>/cpu.rs`,
//! `<family>/cuda.rs`, `<family>/<family>.cu`).
pub mod fill;
